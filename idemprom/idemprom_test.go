package idemprom_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
)

// TestCountsOutcomes runs a real processor on PostgreSQL and reads the
// counters back: applied, duplicate, dead-lettered and a key conflict.
func TestCountsOutcomes(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	if again := idemprom.New(reg); again == nil {
		t.Fatal("second New on the same registry must reuse the collectors")
	}
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, Hooks: []idem.Hook{m},
		Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	p.Process(ctx, idem.Message{ID: "evt-1", Body: []byte("a")})
	p.Process(ctx, idem.Message{ID: "evt-1", Body: []byte("a")})
	p.Process(ctx, idem.Message{ID: "evt-1", Body: []byte("b")})
	p.Process(ctx, idem.Message{})
	m.Redelivered("ledger")

	for outcome, want := range map[string]float64{"applied": 1, "duplicate": 2, "dead_lettered": 1} {
		if got := testutil.ToFloat64(m.MessagesCounter().WithLabelValues("ledger", outcome)); got != want {
			t.Errorf("idem_messages_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "idem_key_conflicts_total", "idem_redelivered_total", "idem_process_seconds"); err != nil || n != 3 {
		t.Fatalf("gathered %d series (%v), want conflicts, redelivered and the histogram", n, err)
	}
	conflicts, err := testutil.GatherAndCount(reg, "idem_key_conflicts_total")
	if err != nil || conflicts != 1 {
		t.Fatalf("conflict series %d (%v)", conflicts, err)
	}
}

// TestRetentionMetrics prunes a real inbox with the metrics as its hooks.
func TestRetentionMetrics(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	var (
		_ retention.PruneHook  = m
		_ retention.DropHook   = m
		_ retention.OldestHook = m
	)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Hooks: []idem.Hook{m}})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until)
SELECT 'ledger', 'old-' || g, 'old-' || g, '\x00', now() - interval '20 days', now() - interval '20 days' FROM generate_series(1, 7) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Prune(ctx, pgxinbox.PruneOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.PrunedCounter().WithLabelValues("idem_inbox")); got != 7 {
		t.Fatalf("idem_inbox_markers_pruned_total = %v, want 7", got)
	}
	if n, err := testutil.GatherAndCount(reg, "idem_inbox_oldest_marker_age_seconds"); err != nil || n != 1 {
		t.Fatalf("oldest marker gauge: %d series (%v)", n, err)
	}
}

// TestHooks wires Metrics in as the processor's one hook and reads back
// what the processor reports through it: untimed messages and failed tries
// by class.
func TestHooks(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	failed := false
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, Hooks: []idem.Hook{m},
		Retry: idem.RetryPolicy{Backoff: idem.Backoff{Initial: time.Millisecond, Max: time.Millisecond}},
		Handler: func(context.Context, pgx.Tx, idem.Message) error {
			if !failed {
				failed = true
				return errors.New("gateway timed out")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Process(ctx, idem.Message{ID: "evt-untimed"}); r.Outcome != idem.Applied || !r.Untimed {
		t.Fatalf("untimed message: %v untimed=%v", r.Outcome, r.Untimed)
	}
	p.Process(ctx, idem.Message{ID: "evt-timed", Time: time.Now(), TimeSource: idem.TimeFromHeader})
	if got := testutil.ToFloat64(m.MessagesCounter().WithLabelValues("ledger", "applied")); got != 2 {
		t.Errorf("applied = %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "idem_untimed_total"); err != nil || n != 1 {
		t.Fatalf("untimed series %d (%v)", n, err)
	}
	want := "\n# HELP idem_untimed_total Messages with no usable event time, by outcome (dead_lettered: refused by Config.RefuseUntimed): their markers are kept a window after they were written, and a replay after that is not recognised.\n# TYPE idem_untimed_total counter\nidem_untimed_total{consumer=\"ledger\",outcome=\"applied\"} 1\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_untimed_total"); err != nil {
		t.Fatal(err)
	}
	wantAttempts := "\n# HELP idem_attempts_failed_total Failed transaction tries, by error class (transient, permanent, unavailable, config, busy) and whether the try carried a batch.\n# TYPE idem_attempts_failed_total counter\nidem_attempts_failed_total{batch=\"false\",class=\"transient\",consumer=\"ledger\"} 1\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantAttempts), "idem_attempts_failed_total"); err != nil {
		t.Fatal(err)
	}
}
