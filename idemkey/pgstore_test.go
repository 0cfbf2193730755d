package idemkey_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemkey"
	"github.com/idemkit/idem/internal/pgtest"
)

func claim(key, token string) idemkey.Claim {
	return idemkey.Claim{Key: key, Fingerprint: []byte("fp-" + key), Token: token, Lease: time.Minute, TTL: time.Hour}
}

func TestPGStoreLeaseTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := newStore(t)
	first, second := claim("k-1", "t-1"), claim("k-1", "t-2")
	if rec, err := store.Claim(ctx, first); err != nil || rec != nil {
		t.Fatalf("first claim: %+v, %v", rec, err)
	}
	if rec, err := store.Claim(ctx, second); err != nil || rec == nil || rec.Response != nil {
		t.Fatalf("claim while in progress: %+v, %v; want a record without response", rec, err)
	}
	// The first server died mid-request: its lease runs out.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if rec, err := store.Claim(ctx, second); err != nil || rec != nil {
		t.Fatalf("claim after the lease ran out: %+v, %v; want a win", rec, err)
	}
	if err := store.Extend(ctx, first); !errors.Is(err, idemkey.ErrLeaseLost) {
		t.Fatalf("extension of the lost claim: %v, want ErrLeaseLost", err)
	}
	if err := store.Extend(ctx, second); err != nil {
		t.Fatalf("extension of the holding claim: %v", err)
	}
	if err := store.Complete(ctx, first, idemkey.Response{Status: 201}); !errors.Is(err, idemkey.ErrLeaseLost) {
		t.Fatalf("late completion of the first claim: %v, want ErrLeaseLost", err)
	}
	if err := store.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	resp := idemkey.Response{Status: 201, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("ok")}
	if err := store.Complete(ctx, second, resp); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Claim(ctx, claim("k-1", "t-3"))
	if err != nil || rec == nil || rec.Response == nil {
		t.Fatalf("claim after completion: %+v, %v", rec, err)
	}
	if r := rec.Response; r.Status != 201 || string(r.Body) != "ok" || r.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("stored response %+v", r)
	}
	// Another request with the key is refused: its lookup skips the body.
	other := claim("k-1", "t-4")
	other.Fingerprint = []byte("another request")
	rec, err = store.Claim(ctx, other)
	if err != nil || rec == nil || rec.Response == nil || string(rec.Fingerprint) != "fp-k-1" || len(rec.Response.Body) != 0 {
		t.Fatalf("claim with another fingerprint: %+v, %v; want the record without its body", rec, err)
	}
}

func TestPGStorePrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := newStore(t)
	for _, k := range []string{"old-1", "old-2", "fresh"} {
		c := claim(k, "t-"+k)
		if _, err := store.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
		if err := store.Complete(ctx, c, idemkey.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '2 hours' WHERE key LIKE 'old-%'`); err != nil {
		t.Fatal(err)
	}
	// An expired response no longer answers: the key is free again.
	if rec, err := store.Claim(ctx, claim("old-2", "t-new")); err != nil || rec != nil {
		t.Fatalf("claim of an expired key: %+v, %v; want a win", rec, err)
	}
	if n, err := store.Prune(ctx, 3*time.Hour); err != nil || n != 0 {
		t.Fatalf("prune of records expired over 3h ago: %d, %v; want 0", n, err)
	}
	if n, err := store.Prune(ctx, 0); err != nil || n != 1 {
		t.Fatalf("prune: %d, %v; want 1 (old-1)", n, err)
	}
	var left []string
	rows, _ := pool.Query(ctx, `SELECT key FROM idempotency_keys ORDER BY key`)
	for rows.Next() {
		var k string
		_ = rows.Scan(&k)
		left = append(left, k)
	}
	if rows.Err() != nil || len(left) != 2 || left[0] != "fresh" || left[1] != "old-2" {
		t.Fatalf("left after prune: %q, %v", left, rows.Err())
	}
}

func TestPGStoreMigrateConcurrentlyAndTableNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	var schema string // the test's own schema, named explicitly
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	store, err := idemkey.NewPGStore(pool, &idemkey.PGConfig{Table: schema + ".keys"})
	if err != nil {
		t.Fatal(err)
	}
	if store.Table() != `"`+schema+`"."keys"` {
		t.Fatalf("Table() = %s", store.Table())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- store.Migrate(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if rec, err := store.Claim(ctx, claim("k", "t")); err != nil || rec != nil {
		t.Fatalf("claim on a schema-qualified table: %+v, %v", rec, err)
	}
	for _, bad := range []string{`keys"; DROP TABLE x; --`, "a.b.c", "1keys", "payments."} {
		if _, err := idemkey.NewPGStore(pool, &idemkey.PGConfig{Table: bad}); !errors.Is(err, idemkey.ErrConfig) {
			t.Errorf("table %q: %v, want ErrConfig", bad, err)
		}
	}
}

func TestPGStoreSubMillisecondLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := newStore(t)
	c := claim("k-1", "t-1")
	c.Lease = 500 * time.Microsecond
	if rec, err := store.Claim(ctx, c); err != nil || rec != nil {
		t.Fatalf("claim: %+v, %v", rec, err)
	}
	// A lease under a millisecond is rounded up, not truncated to none.
	var lease time.Duration
	if err := pool.QueryRow(ctx, `SELECT expires_at - created_at FROM idempotency_keys`).Scan(&lease); err != nil {
		t.Fatal(err)
	}
	if lease != time.Millisecond {
		t.Fatalf("stored lease of a 500µs claim: %v, want 1ms", lease)
	}
}

func TestPGStoreLongTableNamesGetTheirOwnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	// Two 63-byte names that differ only in their last byte: PostgreSQL
	// would truncate "<table>_expires_at_idx" of both to the same name.
	for _, last := range []string{"a", "b"} {
		table := strings.Repeat("k", 62) + last
		store, err := idemkey.NewPGStore(pool, &idemkey.PGConfig{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var indexes []string
	rows, _ := pool.Query(ctx, `SELECT tablename || ' ' || indexname FROM (
    SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() OFFSET 0) i
WHERE indexdef LIKE '%(expires_at)' ORDER BY 1`)
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		indexes = append(indexes, s)
	}
	if rows.Err() != nil || len(indexes) != 2 {
		t.Fatalf("expires_at indexes: %q, %v; want one per table", indexes, rows.Err())
	}
}

// A takeover that commits while Prune waits on its row must survive: Prune
// chose the row while it was expired, but it no longer is.
func TestPGStorePruneSparesATakeoverCommittedMidPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := newStore(t)
	old := claim("k-1", "t-old")
	if _, err := store.Claim(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var txPID int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&txPID); err != nil {
		t.Fatal(err)
	}
	inTx, err := idemkey.NewPGStore(tx, &idemkey.PGConfig{Table: "idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := inTx.Claim(ctx, claim("k-1", "t-new")); err != nil || rec != nil {
		t.Fatalf("takeover: %+v, %v", rec, err)
	}
	pruned := make(chan error, 1)
	go func() {
		_, err := store.Prune(ctx, 0)
		pruned <- err
	}()
	// Wait until Prune is blocked on the takeover's row lock.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))`, txPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Prune never waited on the takeover")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-pruned; err != nil {
		t.Fatal(err)
	}
	var token string
	if err := pool.QueryRow(ctx, `SELECT token FROM idempotency_keys WHERE key = 'k-1'`).Scan(&token); err != nil || token != "t-new" {
		t.Fatalf("after prune: token %q, %v; want the takeover t-new kept", token, err)
	}
}
