package pgxinbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// The first released schema of each layout, as the previous release
// created it, with its bookkeeping at version 1.
const (
	v1Plain = `CREATE TABLE idem_inbox (
    consumer     text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    message_id   text        NOT NULL,
    body_sha256  bytea       NOT NULL,
    event_time   timestamptz,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key)
);
CREATE INDEX idem_inbox_processed_at_idx ON idem_inbox (processed_at);`
	v1Partitioned = `CREATE TABLE idem_inbox (
    consumer     text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    message_id   text        NOT NULL,
    body_sha256  bytea       NOT NULL,
    event_time   timestamptz NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key, event_time)
) PARTITION BY RANGE (event_time);`
	v1Bookkeeping = `CREATE TABLE idem_migrations (
    table_name text PRIMARY KEY,
    version    int  NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO idem_migrations (table_name, version) VALUES ('"idem_inbox"', 1);`
)

// TestUpgradePlain: a table of the previous release gets keep_until,
// backfilled as the later of each marker's write and event times (what the
// prune used before), its index, and the stored window; its markers stay
// duplicates and the prune keeps what it kept before.
// ownIndexes are the definitions of the indexes of the test's own schema.
// The fence (OFFSET 0) keeps the planner from computing the definition of
// every index in the database, some of which other tests' schemas are
// dropping at that moment ("could not open relation with OID").
const ownIndexes = `SELECT count(*) FROM (SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() OFFSET 0) i`

func TestUpgradePlain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, v1Plain+v1Bookkeeping); err != nil {
		t.Fatal(err)
	}
	now := dbNow(t, pool)
	old, young := now.Add(-window-time.Hour), now.Add(-window+time.Hour)
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at) VALUES
('ledger', 'evt-old', 'evt-old', '\x00', $1, $1),
('ledger', 'evt-event-young', 'evt-event-young', '\x00', $2, $1),
('ledger', 'evt-untimed', 'evt-untimed', '\x00', NULL, $2)`, old, young); err != nil {
		t.Fatal(err)
	}
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]time.Time{"evt-old": old, "evt-event-young": young, "evt-untimed": young} {
		if got := scalar[time.Time](t, pool, `SELECT keep_until FROM idem_inbox WHERE key = $1`, key); !got.Equal(want) {
			t.Errorf("%s: keep_until %v, want %v", key, got, want)
		}
	}
	if n := scalar[int](t, pool, ownIndexes+` WHERE indexdef LIKE '%(keep_until)'`); n != 1 {
		t.Fatalf("%d keep_until indexes, want 1", n)
	}
	if n := scalar[int](t, pool, ownIndexes+` WHERE indexdef LIKE '%(processed_at)'`); n != 0 {
		t.Fatalf("%d processed_at indexes after the upgrade, want none: the prune goes by keep_until", n)
	}
	if v := scalar[int](t, pool, `SELECT version FROM idem_migrations`); v != 2 {
		t.Fatalf("version %d, want 2", v)
	}
	if set, err := store.Settings(ctx); err != nil || set.Window != window || set.Layout != pgxinbox.Plain {
		t.Fatalf("settings after the upgrade: %+v %v", set, err)
	}
	res, err := store.Prune(ctx, pgxinbox.PruneOptions{})
	if err != nil || res.Markers != 1 {
		t.Fatalf("prune after the upgrade: %+v %v, want the one old marker", res, err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text, key text, message_id text)`); err != nil {
		t.Fatal(err)
	}
	want(t, processor(t, store, nil).Process(ctx, idem.Message{ID: "evt-event-young", Time: young, Body: []byte("{}")}), idem.Duplicate)
}

// TestUpgradePartitioned: the partition column of a table of the previous
// release is renamed to partition_time in place (PostgreSQL allows it on
// the partition key: no row moves), event_time and keep_until are added and
// filled, and a marker written before is met by a claim whose partition
// time is its old event time: the time inside a UUIDv7 message ID, which the
// processor derives from the key.
func TestUpgradePartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, v1Partitioned+v1Bookkeeping); err != nil {
		t.Fatal(err)
	}
	sent := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Millisecond)
	day := sent.Truncate(24 * time.Hour)
	if _, err := pool.Exec(ctx, `CREATE TABLE idem_inbox`+day.Format("_p20060102")+` PARTITION OF idem_inbox FOR VALUES FROM ('`+
		day.Format(time.RFC3339)+`') TO ('`+day.Add(24*time.Hour).Format(time.RFC3339)+`')`); err != nil {
		t.Fatal(err)
	}
	id := uuidv7(sent, 1)
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time) VALUES ('ledger', $1, $1, '\x00', $2)`, id, sent); err != nil {
		t.Fatal(err)
	}
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: pgxinbox.Partitioned})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var pt, et, ku time.Time
	if err := pool.QueryRow(ctx, `SELECT partition_time, event_time, keep_until FROM idem_inbox`).Scan(&pt, &et, &ku); err != nil {
		t.Fatal(err)
	}
	if !pt.Equal(sent) || !et.Equal(sent) || ku.Before(sent) {
		t.Fatalf("after the upgrade: partition_time %v, event_time %v, keep_until %v; want %v, %v and not before it", pt, et, ku, sent, sent)
	}
	if key := scalar[string](t, pool, `SELECT pg_get_partkeydef('idem_inbox'::regclass)`); key != "RANGE (partition_time)" {
		t.Fatalf("partition key %q, want RANGE (partition_time)", key)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text, key text, message_id text)`); err != nil {
		t.Fatal(err)
	}
	// A copy republished with another timestamp still meets the marker.
	want(t, processor(t, store, nil).Process(ctx, idem.Message{ID: id, Time: sent.Add(time.Minute), Body: []byte("{}")}), idem.Duplicate)
}

// TestLockTimeoutUnderOneMillisecond: a lock timeout under 1ms still bounds
// the wait (1ms), where it used to be sent as "0ms", which PostgreSQL reads
// as no limit: the claim then waited for the holder as long as it lived.
func TestLockTimeoutUnderOneMillisecond(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, store := openLayout(t, pgxinbox.Plain, nil)
	claim := []idemstore.Claim{{Key: "held", MessageID: "held", BodySHA256: []byte{0}}}
	holder, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := store.Claim(ctx, holder, "ledger", claim, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{time.Microsecond, 999 * time.Microsecond} {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		tx, err := store.Begin(wctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = store.Claim(wctx, tx, "ledger", claim, d)
		_ = tx.Rollback(ctx)
		cancel()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || time.Since(start) > 2*time.Second {
			t.Fatalf("claim behind a held key with lock timeout %v: %v after %v, want lock_timeout (55P03) at once", d, err, time.Since(start))
		}
	}
}

// TestExtendWritesNothingWhenNotGrowing: an extension to a time not later
// than the stored keep_until leaves the row as it is (no new row version),
// so a plain redelivery costs no write; a later one writes.
func TestExtendWritesNothingWhenNotGrowing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Plain, nil)
	now := dbNow(t, pool)
	insertMarker(t, pool, "k", ptr(now), now)
	xmin := func() string { return scalar[string](t, pool, `SELECT xmin::text FROM idem_inbox WHERE key = 'k'`) }
	run := func(at time.Time) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return store.Extend(ctx, tx, "ledger", []idemstore.Extension{{Key: "k", KeepUntil: at}})
		}); err != nil {
			t.Fatal(err)
		}
	}
	before := xmin()
	run(now)
	run(now.Add(-time.Hour))
	if after := xmin(); after != before {
		t.Fatalf("an extension that does not grow wrote the row (xmin %s -> %s)", before, after)
	}
	run(now.Add(time.Hour))
	if after := xmin(); after == before {
		t.Fatalf("an extension that grows did not write")
	}
}

// TestLengthenRamps: after lengthening the stored window, markers older
// than the old window may be gone, so processors may guard only with the
// old window at first, more as time passes, the new one once the
// difference has passed; the prune keeps markers for the new window at
// once.
func TestLengthenRamps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Plain, nil)
	if _, err := store.SetWindow(ctx, 30*24*time.Hour, false); err != nil {
		t.Fatal(err)
	}
	stored, guard, err := store.WindowStatus(ctx)
	if err != nil || stored != 30*24*time.Hour || guard < window || guard > window+time.Minute {
		t.Fatalf("right after lengthening: stored %v guard %v (%v), want 720h and about 336h", stored, guard, err)
	}
	if set, err := store.Settings(ctx); err != nil || set.Window < guard || set.Window > guard+time.Minute {
		t.Fatalf("settings %+v %v, want the guard window, %v", set, err, guard)
	}
	// Eight days later the guard has grown by eight days.
	if _, err := pool.Exec(ctx, `UPDATE idem_inbox_settings SET changed_at = changed_at - interval '8 days'`); err != nil {
		t.Fatal(err)
	}
	if _, guard, _ := store.WindowStatus(ctx); guard < 22*24*time.Hour || guard > 22*24*time.Hour+time.Minute {
		t.Fatalf("eight days on: guard %v, want about 528h", guard)
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_inbox_settings SET changed_at = changed_at - interval '10 days'`); err != nil {
		t.Fatal(err)
	}
	if set, err := store.Settings(ctx); err != nil || set.Window != 30*24*time.Hour {
		t.Fatalf("once the difference has passed: %+v %v, want the new window", set, err)
	}
	// Shortening takes effect for the guard at once.
	if _, err := store.SetWindow(ctx, 20*24*time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if set, err := store.Settings(ctx); err != nil || set.Window != 20*24*time.Hour {
		t.Fatalf("after shortening: %+v %v", set, err)
	}
}
