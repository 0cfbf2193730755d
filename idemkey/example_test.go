package idemkey_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemkey"
	"github.com/idemkit/idem/internal/pgtest"
)

// A payment gateway behind the middleware, and the invoices consumer that
// calls it with a key derived from the renewal. The broker delivers the
// SubscriptionRenewed event twice; the card is charged once.
func Example() {
	ctx := context.Background()
	pool, schema, cleanup := examplePool(ctx)
	defer cleanup()

	// The gateway: every request that reaches the handler moves money.
	store, err := idemkey.NewPGStore(pool, &idemkey.PGConfig{Table: schema + ".gateway_keys"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	var charged atomic.Int64
	gateway := http.NewServeMux()
	gateway.Handle("POST /charges", idemkey.Middleware(store, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charged.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":"ch-%06d"}`, n)
	})))
	srv := httptest.NewServer(gateway)
	defer srv.Close()

	// The consumer: the key names the business action, not the invoice row.
	client := &http.Client{Transport: &idemkey.Transport{Base: srv.Client().Transport}}
	chargeRenewal := func(subscription, period string, amount int64) {
		key := idemkey.Derive("renew", subscription, period)
		req, err := http.NewRequestWithContext(idemkey.WithKey(ctx, key), http.MethodPost,
			srv.URL+"/charges", strings.NewReader(fmt.Sprintf(`{"amount":%d}`, amount)))
		if err != nil {
			log.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%s: %d %s replayed=%t\n", key, resp.StatusCode, body, resp.Header.Get(idemkey.ReplayedHeader) == "true")
	}
	chargeRenewal("sub-8421", "2026-03", 5_000_000)
	chargeRenewal("sub-8421", "2026-03", 5_000_000) // the redelivery
	fmt.Println("charges:", charged.Load())
	// Output:
	// renew:sub-8421:2026-03: 201 {"charge":"ch-000001"} replayed=false
	// renew:sub-8421:2026-03: 201 {"charge":"ch-000001"} replayed=true
	// charges: 1
}

// examplePool connects to the test server and makes a schema of its own.
func examplePool(ctx context.Context) (*pgxpool.Pool, string, func()) {
	pool, err := pgxpool.New(ctx, pgtest.BaseURL())
	if err != nil {
		log.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "idemkey_example_" + hex.EncodeToString(b[:])
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatalf("PostgreSQL at %s: %v; %s", pgtest.BaseURL(), err, pgtest.FixHint)
	}
	return pool, schema, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}
}
