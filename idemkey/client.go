package idemkey

import (
	"context"
	"fmt"
	"net/http"
)

// Header is the request header that carries an idempotency key, as named by
// the IETF httpapi draft "The Idempotency-Key HTTP Header Field" and used by
// Stripe, Adyen and most payment gateways.
const Header = "Idempotency-Key"

type ctxKey struct{}

// WithKey returns a context carrying key for the one call made with it: a
// [Transport] sends it as the [Header] of that call and of its retries. Give
// each distinct call its own context; two calls sharing a key are one call to
// the server. An empty key carries nothing.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, ctxKey{}, key)
}

// KeyFrom returns the key [WithKey] put in ctx, and whether there is one.
func KeyFrom(ctx context.Context) (string, bool) {
	key, _ := ctx.Value(ctxKey{}).(string)
	return key, key != ""
}

// Transport is an http.RoundTripper that sets the [Header] of a request
// whose context carries a key ([WithKey]). Requests without a key, and
// requests that already have the header, are sent unchanged: an explicit
// header wins. A key that fails [Validate] fails the request before it is
// sent.
//
//	client := &http.Client{Transport: &idemkey.Transport{}}
//	req, _ := http.NewRequestWithContext(idemkey.WithKey(ctx, key), "POST", url, body)
//	resp, err := client.Do(req)
type Transport struct {
	// Base sends the requests. Defaults to http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper. It never modifies req: a request
// that needs the header is cloned.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	key, ok := KeyFrom(req.Context())
	if !ok || req.Header.Get(Header) != "" {
		return base.RoundTrip(req)
	}
	if err := Validate(key); err != nil {
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper closes the body, even on error
		}
		return nil, fmt.Errorf("setting %s header: %w", Header, err)
	}
	r := req.Clone(req.Context())
	r.Header.Set(Header, key)
	return base.RoundTrip(r)
}
