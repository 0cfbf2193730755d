package idemkey_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/idemkey"
)

func TestTransport(t *testing.T) {
	t.Parallel()
	got := make(chan []string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Values(idemkey.Header)
	}))
	defer srv.Close()
	client := &http.Client{Transport: &idemkey.Transport{Base: srv.Client().Transport}}
	send := func(ctx context.Context, explicit string) ([]string, *http.Request) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if explicit != "" {
			req.Header.Set(idemkey.Header, explicit)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-got, req
	}
	ctx := context.Background()
	key := idemkey.Derive("renew", "sub-8421", "2026-03")

	h, req := send(idemkey.WithKey(ctx, key), "")
	if len(h) != 1 || h[0] != key {
		t.Fatalf("header with a key in context = %q, want [%q]", h, key)
	}
	if req.Header.Get(idemkey.Header) != "" {
		t.Fatal("the transport modified the caller's request")
	}
	if h, _ := send(ctx, ""); len(h) != 0 {
		t.Fatalf("request without a key got header %q", h)
	}
	if h, _ := send(idemkey.WithKey(ctx, key), "explicit-1"); len(h) != 1 || h[0] != "explicit-1" {
		t.Fatalf("explicit header = %q, want [explicit-1]", h)
	}
	if h, _ := send(idemkey.WithKey(ctx, ""), ""); len(h) != 0 {
		t.Fatalf("empty key sent header %q", h)
	}

	req, _ = http.NewRequestWithContext(idemkey.WithKey(ctx, "bad key"), http.MethodPost, srv.URL, nil)
	if _, err := client.Do(req); !errors.Is(err, idemkey.ErrInvalidKey) {
		t.Fatalf("invalid key: error %v, want ErrInvalidKey", err)
	}
	if k, ok := idemkey.KeyFrom(idemkey.WithKey(ctx, key)); !ok || k != key {
		t.Fatalf("KeyFrom = %q, %v", k, ok)
	}
}
