package idemkey_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemkey"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/pooltest"
)

// The store and the middleware work on a pool of one connection: Migrate,
// a request, its replay, duplicates that arrive while the first runs (its
// lease extended meanwhile) and Prune. None asks the pool for a second
// connection while it holds one (internal/pooltest stops the binary if
// one waits).
func TestOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pooltest.OpenPgx(t, pgtest.Schema(t), 1)
	store, err := idemkey.NewPGStore(pool, &idemkey.PGConfig{Table: "idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := store.Migrate(ctx); err != nil {
			t.Fatalf("migrating: %v", err)
		}
	}
	h := &charges{gate: make(chan struct{})}
	srv := serve(t, store, &idemkey.Config{Lease: 3 * time.Second}, h)
	const n = 4
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { answers <- post(t, srv.URL+"/charges", "k-1", "same") })
	}
	for range n - 1 {
		if a := <-answers; a.status != http.StatusConflict {
			t.Errorf("duplicate in progress: %d, want 409", a.status)
		}
	}
	// The winner's lease is extended on the pool's one connection while
	// its handler runs.
	expires := func() (at time.Time) {
		if err := pool.QueryRow(ctx, `SELECT expires_at FROM idempotency_keys WHERE key = 'k-1'`).Scan(&at); err != nil {
			t.Fatalf("reading the lease: %v", err)
		}
		return at
	}
	first := expires()
	for deadline := time.Now().Add(time.Minute); !expires().After(first); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lease of the running request was never extended")
		}
	}
	close(h.gate)
	wg.Wait()
	if won := <-answers; won.status != http.StatusCreated {
		t.Fatalf("winner: %d %s", won.status, won.body)
	}
	if again := post(t, srv.URL+"/charges", "k-1", "same"); again.status != http.StatusCreated || again.header.Get(idemkey.ReplayedHeader) != "true" {
		t.Fatalf("replay: %d, replayed %q", again.status, again.header.Get(idemkey.ReplayedHeader))
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
	if _, err := store.Prune(ctx, 0); err != nil {
		t.Fatalf("pruning: %v", err)
	}
}
