package pgxinbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
)

// TestLateDuplicateRightAfterPrune: a running RefuseLate processor, whose
// pruned-key summaries were loaded before a prune, refuses an untimed
// duplicate of a key that prune removed, sent right after it; before, it
// applied it for up to a minute. The check reads the summaries in the
// claim's own transaction, so it also holds on a pool of one connection.
func TestLateDuplicateRightAfterPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolOfOne(t)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Window: window})
	if err != nil {
		t.Fatal(err)
	}
	onPoolOne(t, "Migrate", func(ctx context.Context) (any, error) { return nil, store.Migrate(ctx) })
	applied := 0
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer:   "ledger",
		Key:        idem.ByMessageID,
		RefuseLate: true,
		Handler:    func(context.Context, pgx.Tx, idem.Message) error { applied++; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	process := func(id string) idem.Result {
		return onPoolOne(t, "Process", func(ctx context.Context) (idem.Result, error) { return p.Process(ctx, idem.Message{ID: id}), nil })
	}
	for _, id := range []string{"evt-old", "evt-kept"} {
		if r := process(id); r.Outcome != idem.Applied {
			t.Fatalf("first delivery of %s: %v (%v)", id, r.Outcome, r.Err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_inbox SET keep_until = now() - interval '40 days' WHERE key = 'evt-old'`); err != nil {
		t.Fatal(err)
	}
	res := onPoolOne(t, "Prune", func(ctx context.Context) (retention.Result, error) { return store.Prune(ctx, retention.Options{}) })
	if res.Markers != 1 {
		t.Fatalf("prune: %+v, want 1 marker", res)
	}
	if r := process("evt-old"); r.Outcome != idem.Expired || r.PrunedOn.IsZero() {
		t.Fatalf("untimed duplicate of a key pruned a moment ago: %v (%v), want Expired (probable late duplicate)", r.Outcome, r.Err)
	}
	if r := process("evt-kept"); r.Outcome != idem.Duplicate {
		t.Fatalf("duplicate of a kept key: %v (%v), want Duplicate", r.Outcome, r.Err)
	}
	if applied != 2 {
		t.Fatalf("handler ran %d times, want 2", applied)
	}
}
