package pgxinbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// timedStore gives every claim without an event time the same fixed one, so
// the shared conformance suite, whose messages carry no time, runs on the
// partitioned layout. A real consumer sets Message.Time instead.
type timedStore struct {
	*pgxinbox.Store
	at time.Time
}

func (s timedStore) Claim(ctx context.Context, tx pgx.Tx, consumer string, claims []idem.Claim, lockTimeout time.Duration) ([]bool, error) {
	cs := slices.Clone(claims)
	for i := range cs {
		if cs[i].EventTime.IsZero() {
			cs[i].EventTime = s.at
		}
	}
	return s.Store.Claim(ctx, tx, consumer, cs, lockTimeout)
}

func TestPartitionedConformance(t *testing.T) {
	at := time.Now().Add(-time.Hour)
	conformance(t, pgxinbox.Partitioned, func(s *pgxinbox.Store) idem.Store[pgx.Tx] { return timedStore{s, at} })
}

// TestPartitionedRefusesNoEventTime: without an event time the partitioned
// inbox cannot find a redelivery's marker, so the message is dead-lettered
// with a permanent error, alone or in a batch, and never applied.
func TestPartitionedRefusesNoEventTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Partitioned, nil)
	p := processor(t, store, nil)
	r := p.Process(ctx, idem.Message{ID: "evt-untimed", Body: []byte("{}")})
	if r.Outcome != idem.DeadLettered || !idem.IsPermanent(r.Err) || !errors.Is(r.Err, pgxinbox.ErrNoEventTime) {
		t.Fatalf("untimed message: %v %v, want dead-lettered with ErrNoEventTime", r.Outcome, r.Err)
	}
	rs := p.ProcessBatch(ctx, []idem.Message{
		{ID: "evt-timed", Time: time.Now(), Body: []byte("{}")},
		{ID: "evt-untimed-2", Body: []byte("{}")},
	})
	want(t, rs[0], idem.Applied)
	want(t, rs[1], idem.DeadLettered)
	if n := scalar[int](t, pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects = %d, want 1 (the timed message only)", n)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox`); n != 1 {
		t.Fatalf("markers = %d, want 1", n)
	}
}

// TestMidnight: a message first processed at 23:59 and redelivered at 00:01
// is applied once, because the partition follows the message's event time,
// not the time of processing. The second half shows, with raw SQL, what the
// same two deliveries do to an inbox partitioned by processed_at: PostgreSQL
// puts the partition column into the unique key, the two deliveries fall on
// two days, and both claims succeed.
func TestMidnight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Partitioned, nil)
	p := processor(t, store, nil)
	yesterday := time.Now().UTC().Truncate(24 * time.Hour).Add(-24 * time.Hour)
	firstSeen := yesterday.Add(23*time.Hour + 59*time.Minute)
	msg := idem.Message{ID: "0190b0e2-5b3f-7c1d-9a4e-2f6c8d0e1a2b", Time: yesterday.Add(23*time.Hour + 58*time.Minute), Body: []byte(`{"amount":12500}`)}
	want(t, p.Process(ctx, msg), idem.Applied)
	// The first delivery was processed at 23:59.
	if _, err := pool.Exec(ctx, `UPDATE idem_inbox SET processed_at = $1`, firstSeen); err != nil {
		t.Fatal(err)
	}
	// The redelivery arrives after midnight, today.
	want(t, p.Process(ctx, msg), idem.Duplicate)
	if n := scalar[int](t, pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects = %d after a redelivery across midnight, want 1", n)
	}
	if part := scalar[string](t, pool, `SELECT tableoid::regclass::text FROM idem_inbox`); part != "idem_inbox"+yesterday.Format("_p20060102") {
		t.Fatalf("marker in partition %s, want the event time's day", part)
	}

	// The tempting layout, partitioned by processed_at.
	for _, q := range []string{
		`CREATE TABLE bad_inbox (consumer text, key text, processed_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, key, processed_at)) PARTITION BY RANGE (processed_at)`,
		`CREATE TABLE bad_inbox_d1 PARTITION OF bad_inbox FOR VALUES FROM ('2026-03-01 00:00+00') TO ('2026-03-02 00:00+00')`,
		`CREATE TABLE bad_inbox_d2 PARTITION OF bad_inbox FOR VALUES FROM ('2026-03-02 00:00+00') TO ('2026-03-03 00:00+00')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE bad_inbox_nokey (consumer text, key text, processed_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, key)) PARTITION BY RANGE (processed_at)`); err == nil {
		t.Fatalf("PostgreSQL accepted a unique key without the partition column; the premise of this test changed")
	}
	claimed := 0
	for _, at := range []string{"2026-03-01 23:59+00", "2026-03-02 00:01+00"} {
		tag, err := pool.Exec(ctx, `INSERT INTO bad_inbox VALUES ('ledger', 'evt-1', $1) ON CONFLICT (consumer, key, processed_at) DO NOTHING`, at)
		if err != nil {
			t.Fatal(err)
		}
		claimed += int(tag.RowsAffected())
	}
	if claimed != 2 {
		t.Fatalf("processed_at partitioning: %d claims succeeded, expected the duplicate to get through (2)", claimed)
	}
}

// TestPartitions: partitions are created ahead idempotently, expired ones
// dropped (never one inside the window), with their markers; a dropped day's
// message is Expired by the guard, and a consumer without the guard gets a
// transient error rather than a silent re-application.
func TestPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &recorder{}
	pool, store := openLayout(t, pgxinbox.Partitioned, rec)
	now := dbNow(t, pool)
	today := now.UTC().Truncate(24 * time.Hour)
	parts, err := store.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Migrate covered the window and the days ahead.
	if len(parts) != 15+pgxinbox.DefaultDaysAhead || parts[len(parts)-1] != "idem_inbox"+today.AddDate(0, 0, pgxinbox.DefaultDaysAhead).Format("_p20060102") {
		t.Fatalf("partitions after Migrate: %v", parts)
	}
	created, err := store.EnsurePartitions(ctx, today.AddDate(0, 0, -20), 30)
	if err != nil {
		t.Fatal(err)
	}
	if len(created) != 30-len(parts) {
		t.Fatalf("ensure created %d (%v), want only the %d missing", len(created), created, 30-len(parts))
	}
	if again, err := store.EnsurePartitions(ctx, today, 3); err != nil || len(again) != 0 {
		t.Fatalf("second ensure: %v %v, want nothing created", again, err)
	}
	// One marker per day from 20 days ago to today.
	p := processor(t, store, &idem.Horizon{Window: -1})
	for d := -20; d <= 0; d++ {
		m := idem.Message{ID: today.AddDate(0, 0, d).Format("evt-2006-01-02"), Time: today.AddDate(0, 0, d).Add(time.Hour), Body: []byte("{}")}
		want(t, p.Process(ctx, m), idem.Applied)
	}
	if _, err := store.DropPartitions(ctx, now.Add(-window+time.Hour), false); err == nil {
		t.Fatalf("a cut-off inside the window must be refused")
	}
	cutoff := now.Add(-window)
	dry, err := store.DropPartitions(ctx, cutoff, true)
	if err != nil {
		t.Fatal(err)
	}
	// Days -20 … -15 end before now-14d; day -14 ends after it.
	if len(dry) != 6 || dry[0] != "idem_inbox"+today.AddDate(0, 0, -20).Format("_p20060102") {
		t.Fatalf("dry run would drop %v, want the six days before the window", dry)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox`); n != 21 {
		t.Fatalf("dry run deleted markers: %d left", n)
	}
	res, err := store.Prune(ctx, pgxinbox.PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Partitions, dry) {
		t.Fatalf("prune dropped %v, dry run said %v", res.Partitions, dry)
	}
	if rec.dropped.Load() != 6 {
		t.Fatalf("hooks saw %d partitions dropped, want 6", rec.dropped.Load())
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox`); n != 15 {
		t.Fatalf("markers left = %d, want 15 (days -14 … 0)", n)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox WHERE event_time < $1`, cutoff); n != 0 {
		// Day -14 straddles the cut-off only when it is later than 01:00;
		// either way nothing before the first kept day remains.
		if n2 := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox WHERE event_time < $1`, today.AddDate(0, 0, -14)); n2 != 0 {
			t.Fatalf("%d markers older than the first kept day remain", n2)
		}
	}
	old := idem.Message{ID: today.AddDate(0, 0, -18).Format("evt-2006-01-02"), Time: today.AddDate(0, 0, -18).Add(time.Hour), Body: []byte("{}")}
	want(t, processor(t, store, nil).Process(ctx, old), idem.Expired)
	// Without the guard the claim finds its day dropped: the store refuses
	// it as expired (dead-lettered), never a second effect, never a loop.
	r := p.Process(ctx, old)
	if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, idem.ErrExpired) {
		t.Fatalf("unguarded claim into a dropped day: %v %v, want DeadLettered with ErrExpired", r.Outcome, r.Err)
	}
	// A day not created yet is transient: EnsurePartitions will make it.
	future := idem.Message{ID: "evt-future", Time: today.AddDate(0, 0, 60), Body: []byte("{}")}
	if r := p.Process(ctx, future); r.Outcome != idem.Retry || !errors.Is(r.Err, pgxinbox.ErrNoPartition) {
		t.Fatalf("claim into a day not created yet: %v %v, want Retry with ErrNoPartition", r.Outcome, r.Err)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM effects`); n != 21 {
		t.Fatalf("effects = %d, want 21", n)
	}
}

func TestMigrateRefusesOtherLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	plain, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	part, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: pgxinbox.Partitioned})
	if err != nil {
		t.Fatal(err)
	}
	if err := part.Migrate(ctx); !errors.Is(err, idem.ErrConfig) {
		t.Fatalf("partitioned Migrate over a plain table: %v, want a configuration error", err)
	}
	if _, err := plain.EnsurePartitions(ctx, time.Now(), 1); err == nil {
		t.Fatalf("EnsurePartitions on a plain table must fail")
	}
}
