package pgxinbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
)

// timedStore gives every claim without a partition time the same fixed one,
// so the shared conformance suite, whose message IDs are not UUIDv7s, runs
// on the partitioned layout. It hides the layout from the processor (which
// would otherwise refuse such keys, rightly) and forwards the rest. A real
// consumer uses UUIDv7 IDs or sets idem.Config.PartitionTime instead.
type timedStore struct {
	*pgxinbox.Store
	at time.Time
}

func (s timedStore) Layout() idemstore.Layout { return idemstore.LayoutPlain }

func (s timedStore) Settings(ctx context.Context) (idemstore.Settings, error) {
	st, err := s.Store.Settings(ctx)
	st.Layout = idemstore.LayoutPlain
	return st, err
}

func (s timedStore) SettingsIn(ctx context.Context, tx pgx.Tx) (idemstore.Settings, error) {
	st, err := s.Store.SettingsIn(ctx, tx)
	st.Layout = idemstore.LayoutPlain
	return st, err
}

func (s timedStore) Claim(ctx context.Context, tx pgx.Tx, consumer string, claims []idemstore.Claim, lockTimeout time.Duration) ([]bool, error) {
	cs := slices.Clone(claims)
	for i := range cs {
		if cs[i].PartitionTime.IsZero() {
			cs[i].PartitionTime = s.at
		}
	}
	return s.Store.Claim(ctx, tx, consumer, cs, lockTimeout)
}

func TestPartitionedConformance(t *testing.T) {
	at := time.Now().Add(-time.Hour)
	conformance(t, pgxinbox.Partitioned, func(s *pgxinbox.Store) idemstore.Store[pgx.Tx] { return timedStore{s, at} })
}

// TestPartitionedRefusesNoPartitionTime: without a partition time the
// partitioned inbox cannot find a redelivery's marker, so a claim without
// one is refused with a permanent error naming the rule, and the processor
// dead-letters a message whose key gives none, alone or in a batch, and
// never applies it.
func TestPartitionedRefusesNoPartitionTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Partitioned, nil)
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Claim(ctx, tx, "ledger", []idemstore.Claim{{Key: "k", MessageID: "m", BodySHA256: []byte{0}, EventTime: time.Now()}}, 0)
	_ = tx.Rollback(ctx)
	if !idem.IsPermanent(err) || !errors.Is(err, idem.ErrNoPartitionTime) || !errors.Is(err, pgxinbox.ErrNoEventTime) ||
		!strings.Contains(err.Error(), "function of the key alone") {
		t.Fatalf("claim without a partition time: %v, want a permanent error wrapping idem.ErrNoPartitionTime that names the rule", err)
	}
	p := processor(t, store, nil)
	r := p.Process(ctx, idem.Message{ID: "evt-not-a-uuidv7", Time: time.Now(), Body: []byte("{}")})
	if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, idem.ErrNoPartitionTime) {
		t.Fatalf("key without a partition time: %v %v, want dead-lettered with ErrNoPartitionTime", r.Outcome, r.Err)
	}
	rs := p.ProcessBatch(ctx, []idem.Message{
		{ID: uuidv7(time.Now(), 1), Body: []byte("{}")},
		{ID: "evt-not-a-uuidv7-2", Body: []byte("{}")},
	})
	want(t, rs[0], idem.Applied)
	want(t, rs[1], idem.DeadLettered)
	if n := scalar[int](t, pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects = %d, want 1 (the UUIDv7 message only)", n)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox`); n != 1 {
		t.Fatalf("markers = %d, want 1", n)
	}
}

// TestRepublishNewTimestamp pins issue 11's first situation: a producer
// whose publisher confirm timed out republishes the same message ID with a
// fresh timestamp (event time from a header or the broker), in another
// batch, on another day. The partition time comes from the key, so the copy
// meets its marker: a Duplicate, one effect. Before, the partition column
// was the event time, and the copy landed on another primary key.
func TestRepublishNewTimestamp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Partitioned, nil)
	p := processor(t, store, nil)
	first := time.Now().UTC().Truncate(24 * time.Hour).Add(-time.Minute) // yesterday 23:59
	id := uuidv7(first, 7)
	want(t, p.Process(ctx, idem.Message{ID: id, Time: first, TimeSource: idem.TimeFromHeader, Body: []byte(`{"amount":12500}`)}), idem.Applied)
	for i, at := range []time.Time{first.Add(time.Second), first.Add(2 * time.Minute), first.Add(-3 * time.Hour)} {
		copyOf := idem.Message{ID: id, Time: at, TimeSource: idem.TimeFromBroker, Body: []byte(`{"amount":12500}`)}
		if i%2 == 0 {
			want(t, p.ProcessBatch(ctx, []idem.Message{copyOf})[0], idem.Duplicate)
		} else {
			want(t, p.Process(ctx, copyOf), idem.Duplicate)
		}
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects = %d after republishing with new timestamps, want 1", n)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox`); n != 1 {
		t.Fatalf("markers = %d, want 1", n)
	}
}

// TestMidnight: a message first processed at 23:59 and redelivered at 00:01
// is applied once, because the partition follows the key's partition time,
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
	sent := yesterday.Add(23*time.Hour + 58*time.Minute)
	msg := idem.Message{ID: uuidv7(sent, 1), Time: sent, Body: []byte(`{"amount":12500}`)}
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
		t.Fatalf("marker in partition %s, want the partition time's day", part)
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
	// One marker per day from 20 days ago to today, keyed by a business
	// key that names its day: the partition time is the day's first hour.
	byDay := func(c *idem.Config[pgx.Tx]) {
		c.PartitionTime = func(key string) (time.Time, error) {
			d, err := time.Parse("evt-2006-01-02", key[:min(len(key), 14)])
			return d.Add(time.Hour), err
		}
	}
	p := processorWith(t, store, func(c *idem.Config[pgx.Tx]) {
		byDay(c)
		c.Horizon = idem.Horizon{Window: -1}
		c.Retry.WaitUnavailable = 100 * time.Millisecond // how long a missing partition is waited for
	})
	for d := -20; d <= 0; d++ {
		m := idem.Message{ID: today.AddDate(0, 0, d).Format("evt-2006-01-02"), Time: today.AddDate(0, 0, d).Add(time.Hour), Body: []byte("{}")}
		want(t, p.Process(ctx, m), idem.Applied)
	}
	if _, err := store.DropPartitions(ctx, now.Add(-window+time.Hour), false); !errors.Is(err, retention.ErrShortWindow) {
		t.Fatalf("a cut-off inside the stored window: %v, want it refused with retention.ErrShortWindow", err)
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
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox WHERE partition_time < $1`, cutoff); n != 0 {
		// Day -14 straddles the cut-off only when it is later than 01:00;
		// either way nothing before the first kept day remains.
		if n2 := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox WHERE partition_time < $1`, today.AddDate(0, 0, -14)); n2 != 0 {
			t.Fatalf("%d markers older than the first kept day remain", n2)
		}
	}
	old := idem.Message{ID: today.AddDate(0, 0, -18).Format("evt-2006-01-02"), Time: today.AddDate(0, 0, -18).Add(time.Hour), Body: []byte("{}")}
	want(t, processorWith(t, store, byDay).Process(ctx, old), idem.Expired)
	// The dropped days' keys were summarised, in the transactions that
	// dropped them: one summary per day for the consumer.
	sums, err := store.PrunedSummaries(ctx, "ledger")
	if err != nil || len(sums) != 6 {
		t.Fatalf("summaries after dropping six days: %d (%v)", len(sums), err)
	}
	has := func(key string) bool {
		return slices.ContainsFunc(sums, func(s idemstore.PrunedSummary) bool { return s.Has(key) })
	}
	if !has(old.ID) || has(today.Format("evt-2006-01-02")) {
		t.Fatalf("summaries: dropped key %v, kept key %v; want true and false", has(old.ID), has(today.Format("evt-2006-01-02")))
	}
	strict := processorWith(t, store, func(c *idem.Config[pgx.Tx]) {
		byDay(c)
		c.Horizon = idem.Horizon{Window: -1}
		c.RefuseLate = true
	})
	if r := strict.Process(ctx, old); r.Outcome != idem.Expired || !errors.Is(r.Err, idem.ErrMarkerPruned) {
		t.Fatalf("a key of a dropped day, unguarded but refusing late duplicates: %v %v, want Expired wrapping ErrMarkerPruned", r.Outcome, r.Err)
	}
	// Without the guard the claim finds its day dropped: the store refuses
	// it as expired (dead-lettered), never a second effect, never a loop.
	r := p.Process(ctx, old)
	if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, idem.ErrExpired) {
		t.Fatalf("unguarded claim into a dropped day: %v %v, want DeadLettered with ErrExpired", r.Outcome, r.Err)
	}
	// A day whose partition is missing (the daily ensure did not run) is
	// transient: EnsurePartitions will make it, and the message then goes
	// through.
	if _, err := pool.Exec(ctx, `DROP TABLE idem_inbox`+today.Format("_p20060102")); err != nil {
		t.Fatal(err)
	}
	late := idem.Message{ID: today.Format("evt-2006-01-02") + "-late", Body: []byte("{}")}
	if r := p.Process(ctx, late); r.Outcome != idem.Retry || !errors.Is(r.Err, pgxinbox.ErrNoPartition) {
		t.Fatalf("claim into a day without its partition: %v %v, want Retry with ErrNoPartition", r.Outcome, r.Err)
	}
	if _, err := store.EnsurePartitions(ctx, today, 1); err != nil {
		t.Fatal(err)
	}
	want(t, p.Process(ctx, late), idem.Applied)
	if n := scalar[int](t, pool, `SELECT count(*) FROM effects`); n != 22 {
		t.Fatalf("effects = %d, want 22", n)
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
