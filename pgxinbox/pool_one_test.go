package pgxinbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
)

// poolOneDeadline bounds each maintenance job of the pool-of-one tests: an
// operation that waits for a second connection of its own pool never
// returns, and the test then fails instead of hanging.
const poolOneDeadline = time.Minute

// onPoolOne runs op with a deadline and fails t when it has not returned by
// then (it waits for a connection its own run holds).
func onPoolOne[T any](t *testing.T, what string, op func(ctx context.Context) (T, error)) T {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := op(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("%s on a pool of one: %v", what, r.err)
		}
		return r.v
	case <-time.After(poolOneDeadline):
		t.Fatalf("%s on a pool of one has not returned after %v: it waits for a second connection while it holds the only one", what, poolOneDeadline)
	}
	panic("unreachable")
}

// poolOfOne is a pool on a fresh schema that opens one connection at most.
func poolOfOne(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Close waits for every connection to come back: one held by an
		// operation that never returned would hang the test binary.
		closed := make(chan struct{})
		go func() { pool.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Error("the pool of one did not close: a connection is still held")
		}
	})
	return pool
}

// TestPoolOfOneMaintenance: on a pool of one connection, Migrate, Prune (in
// batches, its summaries written), Stats and SetWindow all return, and the
// prune's summaries hold the keys it deleted. Before, the prune's final
// summary asked the pool for a second connection while its leader's session
// held the only one, and never returned.
func TestPoolOfOneMaintenance(t *testing.T) {
	t.Parallel()
	pool := poolOfOne(t)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Window: window})
	if err != nil {
		t.Fatal(err)
	}
	onPoolOne(t, "Migrate", func(ctx context.Context) (any, error) { return nil, store.Migrate(ctx) })
	const markers = 1000
	keys := make([]string, markers)
	claims := make([]idemstore.Claim, markers)
	for i := range keys {
		keys[i] = fmt.Sprintf("k-%04d", i)
		claims[i] = idemstore.Claim{Key: keys[i], MessageID: keys[i]}
	}
	onPoolOne(t, "claiming", func(ctx context.Context) (any, error) {
		return nil, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Claim(ctx, tx, "ledger", claims, 0)
			return err
		})
	})
	if _, err := pool.Exec(context.Background(), `UPDATE idem_inbox SET keep_until = now() - interval '40 days'`); err != nil {
		t.Fatal(err)
	}
	res := onPoolOne(t, "Prune", func(ctx context.Context) (retention.Result, error) {
		return store.Prune(ctx, retention.Options{BatchSize: 100})
	})
	if res.Markers != markers || res.Summaries != 1 {
		t.Fatalf("prune on a pool of one: %+v, want %d markers and 1 summary", res, markers)
	}
	sums := onPoolOne(t, "PrunedSummaries", func(ctx context.Context) ([]idemstore.PrunedSummary, error) {
		return store.PrunedSummaries(ctx, "ledger")
	})
	for _, k := range keys {
		if len(sums) == 0 || !sums[0].Has(k) {
			t.Fatalf("key %s pruned on a pool of one is in no summary (%d summaries)", k, len(sums))
		}
	}
	onPoolOne(t, "Stats", func(ctx context.Context) (retention.Stats, error) { return store.Stats(ctx) })
	onPoolOne(t, "SetWindow", func(ctx context.Context) (time.Duration, error) { return store.SetWindow(ctx, 2*window, false) })
}

// TestPoolOfOnePartitions: on a pool of one, the partitioned layout's
// Migrate, EnsurePartitions and the prune that drops old days (each day's
// keys summarised in the transaction of its DROP) return.
func TestPoolOfOnePartitions(t *testing.T) {
	t.Parallel()
	pool := poolOfOne(t)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: pgxinbox.Partitioned, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	onPoolOne(t, "Migrate", func(ctx context.Context) (any, error) { return nil, store.Migrate(ctx) })
	today := time.Now().UTC().Truncate(24 * time.Hour)
	onPoolOne(t, "EnsurePartitions", func(ctx context.Context) ([]string, error) {
		return store.EnsurePartitions(ctx, today.AddDate(0, 0, -20), 21)
	})
	old := today.AddDate(0, 0, -18).Add(time.Hour)
	onPoolOne(t, "claiming", func(ctx context.Context) (any, error) {
		return nil, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Claim(ctx, tx, "ledger", []idemstore.Claim{{Key: "old", MessageID: "old", PartitionTime: old}}, 0)
			return err
		})
	})
	res := onPoolOne(t, "Prune (dropping partitions)", func(ctx context.Context) (retention.Result, error) {
		return store.Prune(ctx, retention.Options{})
	})
	if len(res.Partitions) == 0 {
		t.Fatalf("prune on a pool of one dropped no partition: %+v", res)
	}
	sums := onPoolOne(t, "PrunedSummaries", func(ctx context.Context) ([]idemstore.PrunedSummary, error) {
		return store.PrunedSummaries(ctx, "ledger")
	})
	found := false
	for _, s := range sums {
		found = found || s.Has("old")
	}
	if !found {
		t.Fatalf("the dropped day's key is in none of %d summaries", len(sums))
	}
	onPoolOne(t, "Stats", func(ctx context.Context) (retention.Stats, error) { return store.Stats(ctx) })
}
