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
	// Two more processors of the consumer, their summaries loaded before
	// the prune, so that only the check in the claim's transaction can
	// see it.
	others := make([]*idem.Processor[pgx.Tx], 2)
	for i := range others {
		q, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
			Consumer:   "ledger",
			Key:        idem.ByMessageID,
			RefuseLate: true,
			Handler:    func(context.Context, pgx.Tx, idem.Message) error { applied++; return nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		if r := onPoolOne(t, "Process", func(ctx context.Context) (idem.Result, error) {
			return q.Process(ctx, idem.Message{ID: "evt-kept"}), nil
		}); r.Outcome != idem.Duplicate {
			t.Fatalf("warming a processor: %v (%v)", r.Outcome, r.Err)
		}
		others[i] = q
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
	// Refused beside a message that is applied, in a batch's shared
	// transaction, and in a transaction the caller owns: its marker must
	// not be committed, or its redeliveries would be Duplicates of a
	// message never applied.
	rs := onPoolOne(t, "ProcessBatch", func(ctx context.Context) ([]idem.Result, error) {
		return others[0].ProcessBatch(ctx, []idem.Message{{ID: "evt-old"}, {ID: "evt-new"}}), nil
	})
	if rs[0].Outcome != idem.Expired || rs[1].Outcome != idem.Applied {
		t.Fatalf("batch of the late duplicate and a new message: %v (%v), %v (%v); want Expired, Applied", rs[0].Outcome, rs[0].Err, rs[1].Outcome, rs[1].Err)
	}
	r, err := onPoolOne(t, "ProcessTx", func(ctx context.Context) (idem.Result, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return idem.Result{}, err
		}
		r, perr := others[1].ProcessTx(ctx, tx, idem.Message{ID: "evt-old"})
		if perr != nil {
			return r, tx.Rollback(ctx)
		}
		return r, tx.Commit(ctx)
	}), error(nil)
	if r.Outcome != idem.Expired || err != nil {
		t.Fatalf("ProcessTx of the late duplicate: %v (%v), want Expired", r.Outcome, r.Err)
	}
	var markers int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_inbox WHERE key = 'evt-old'`).Scan(&markers); err != nil || markers != 0 {
		t.Fatalf("markers of the refused late duplicate: %d (%v), want 0", markers, err)
	}
	if applied != 3 {
		t.Fatalf("handler ran %d times, want 3", applied)
	}
}
