package pgxinbox_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

const window = 14 * 24 * time.Hour

// recorder is a retention hook (all three) that remembers what it was told.
type recorder struct {
	pruned  atomic.Int64
	dropped atomic.Int64
	oldest  atomic.Int64 // nanoseconds
}

func (r *recorder) OnPrune(_ string, n int64)          { r.pruned.Add(n) }
func (r *recorder) OnDrop(_ string, n int)             { r.dropped.Add(int64(n)) }
func (r *recorder) OnOldest(_ string, d time.Duration) { r.oldest.Store(int64(d)) }

// openLayout returns a migrated store of the given layout on a fresh schema,
// with an effects table without unique constraint.
func openLayout(t testing.TB, layout pgxinbox.Layout, hooks idem.Hook) (*pgxpool.Pool, *pgxinbox.Store) {
	t.Helper()
	return openLayoutOf(t, layout, hooks, 0)
}

// openLayoutOf is openLayout on a pool of at most conns connections (0:
// pgx's default size).
func openLayoutOf(t testing.TB, layout pgxinbox.Layout, hooks idem.Hook, conns int) (*pgxpool.Pool, *pgxinbox.Store) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.PoolOf(t, conns)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: layout, Window: window, Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text, key text, message_id text)`); err != nil {
		t.Fatal(err)
	}
	return pool, store
}

// processor applies one effect row per fresh message, guarded by the
// store's horizon unless h is given.
func processor(t testing.TB, store *pgxinbox.Store, h *idem.Horizon) *idem.Processor[pgx.Tx] {
	t.Helper()
	return processorWith(t, store, func(c *idem.Config[pgx.Tx]) {
		if h != nil {
			c.Horizon = *h
		}
	})
}

// processorWith is processor with the configuration changed by mod.
func processorWith(t testing.TB, store *pgxinbox.Store, mod func(*idem.Config[pgx.Tx])) *idem.Processor[pgx.Tx] {
	t.Helper()
	cfg := &idem.Config[pgx.Tx]{
		Consumer: "ledger",
		Key:      idem.ByMessageID,
		Horizon:  idem.Horizon{Window: store.Window()},
		Retry:    idem.RetryPolicy{MaxAttempts: 2, Backoff: idem.Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond}},
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ('ledger', $1, $1)`, m.ID)
			return err
		},
	}
	if mod != nil {
		mod(cfg)
	}
	p, err := idem.NewProcessor(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// uuidv7 is a UUIDv7 whose time is t, distinct per seq: the message IDs of a
// producer that assigns them, from which the partitioned inbox takes its
// partition time.
func uuidv7(t time.Time, seq uint32) string {
	var b [16]byte
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70
	b[8] = 0x80
	b[12], b[13], b[14], b[15] = byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq)
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func scalar[T any](t testing.TB, pool *pgxpool.Pool, q string, args ...any) T {
	t.Helper()
	var v T
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
}

func dbNow(t testing.TB, pool *pgxpool.Pool) time.Time {
	return scalar[time.Time](t, pool, `SELECT now()`)
}

func want(t *testing.T, r idem.Result, o idem.Outcome) {
	t.Helper()
	if r.Outcome != o {
		t.Fatalf("message %s: outcome %v, want %v (err %v)", r.MessageID, r.Outcome, o, r.Err)
	}
}

// TestHorizon: a duplicate inside the window is skipped; a replay older
// than the window is Expired and not applied.
func TestHorizon(t *testing.T) {
	t.Parallel()
	for _, layout := range []pgxinbox.Layout{pgxinbox.Plain, pgxinbox.Partitioned} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, store := openLayout(t, layout, nil)
			p := processor(t, store, nil)
			now := time.Now()
			recentAt, oldAt := now.Add(-13*24*time.Hour), now.Add(-window-time.Minute)
			recent := idem.Message{ID: uuidv7(recentAt, 1), Time: recentAt, Body: []byte("{}")}
			want(t, p.Process(ctx, recent), idem.Applied)
			want(t, p.Process(ctx, recent), idem.Duplicate)
			old := idem.Message{ID: uuidv7(oldAt, 2), Time: oldAt, Body: []byte("{}")}
			r := p.Process(ctx, old)
			want(t, r, idem.Expired)
			if !errors.Is(r.Err, idem.ErrExpired) {
				t.Fatalf("expired error %v does not wrap idem.ErrExpired", r.Err)
			}
			if n := scalar[int](t, pool, `SELECT count(*) FROM effects`); n != 1 {
				t.Fatalf("effects = %d, want 1", n)
			}
		})
	}
}

// insertMarker writes a marker with chosen times, as if claimed long ago.
func insertMarker(t testing.TB, pool *pgxpool.Pool, key string, eventTime *time.Time, processedAt time.Time) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until)
VALUES ('ledger', $1, $1, '\x00', $2, $3, greatest($2::timestamptz, $3::timestamptz))`, key, eventTime, processedAt)
	if err != nil {
		t.Fatal(err)
	}
}

func keys(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key FROM idem_inbox ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func ptr(t time.Time) *time.Time { return &t }

// TestPruneRemovesOnlyOlder: a marker goes when both its event time and its
// write time are older than the window, in bounded batches; a dry run
// counts without deleting.
func TestPruneRemovesOnlyOlder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &recorder{}
	pool, store := openLayout(t, pgxinbox.Plain, rec)
	now := dbNow(t, pool)
	old, young := now.Add(-window-time.Hour), now.Add(-window+time.Hour)
	for i := range 7 {
		insertMarker(t, pool, fmt.Sprintf("gone-%d", i), ptr(old), old)
	}
	insertMarker(t, pool, "gone-no-event-time", nil, old)
	insertMarker(t, pool, "keep-young", ptr(young), young)
	insertMarker(t, pool, "keep-no-event-time", nil, young)
	// Written long ago but by a producer whose clock ran ahead: a redelivery
	// carries the young event time and would pass the guard.
	insertMarker(t, pool, "keep-event-time-young", ptr(young), old)
	// A lagging consumer claimed an old message recently: kept a whole
	// window after the write, for business keys that map newer messages to it.
	insertMarker(t, pool, "keep-written-recently", ptr(old), young)

	dry, err := store.Prune(ctx, pgxinbox.PruneOptions{BatchSize: 3, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.Markers != 8 || !dry.DryRun || len(keys(t, pool)) != 12 {
		t.Fatalf("dry run: %+v, %d rows left; want 8 counted and nothing deleted", dry, len(keys(t, pool)))
	}
	res, err := store.Prune(ctx, pgxinbox.PruneOptions{BatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Markers != 8 || res.Batches != 3 {
		t.Fatalf("prune: %+v, want 8 markers in 3 batches of at most 3", res)
	}
	wantKeys := []string{"keep-event-time-young", "keep-no-event-time", "keep-written-recently", "keep-young"}
	if got := keys(t, pool); !slices.Equal(got, wantKeys) {
		t.Fatalf("left %v, want %v", got, wantKeys)
	}
	if rec.pruned.Load() != 8 {
		t.Fatalf("hooks saw %d markers pruned, want 8", rec.pruned.Load())
	}
	if _, err := store.Prune(ctx, pgxinbox.PruneOptions{Window: window - time.Hour}); err == nil {
		t.Fatalf("a prune window shorter than the store's must be refused")
	}
}

// TestPruneOneLeader: while another session holds the table's prune lock, a
// prune does nothing and says so.
func TestPruneOneLeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Plain, nil)
	old := dbNow(t, pool).Add(-window - time.Hour)
	insertMarker(t, pool, "old", ptr(old), old)
	other, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	lock := inboxdb.Postgres(inboxdb.Table{Name: "idem_inbox"}, pgxinbox.Plain)
	var got bool
	if err := other.QueryRow(ctx, lock.TryLock, store.Table()).Scan(&got); err != nil || !got {
		t.Fatalf("taking the lock as another instance: %v %v", got, err)
	}
	res, err := store.Prune(ctx, pgxinbox.PruneOptions{})
	if err != nil || !res.Skipped || res.Markers != 0 || len(keys(t, pool)) != 1 {
		t.Fatalf("prune beside a leader: %+v %v, want skipped with nothing deleted", res, err)
	}
	if _, err := other.Exec(ctx, lock.Unlock, store.Table()); err != nil {
		t.Fatal(err)
	}
	res, err = store.Prune(ctx, pgxinbox.PruneOptions{})
	if err != nil || res.Skipped || res.Markers != 1 {
		t.Fatalf("prune once the leader left: %+v %v, want 1 marker deleted", res, err)
	}
	// The lock was given back: a third run leads again.
	if res, err = store.Prune(ctx, pgxinbox.PruneOptions{}); err != nil || res.Skipped {
		t.Fatalf("prune after a prune: %+v %v: the lock was not released", res, err)
	}
}

// TestGuardAndPruneAgree pins the retention invariant: markers of messages
// spread around the window's edge are pruned, then every message is
// delivered again, by a consumer whose clock runs behind the database's by
// almost the whole skew. None may be applied a second time: each is either
// still a Duplicate or Expired. The same run with a skew smaller than the
// clock difference lets duplicates through, which shows the check can fail.
func TestGuardAndPruneAgree(t *testing.T) {
	t.Parallel()
	const skew = 2 * time.Minute
	for _, tc := range []struct {
		name       string
		skew       time.Duration
		behind     time.Duration
		duplicates bool
	}{
		{"clock behind within skew", skew, skew - 5*time.Second, false},
		{"clock behind beyond skew", time.Nanosecond, skew, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, store := openLayout(t, pgxinbox.Plain, nil)
			now := dbNow(t, pool)
			var msgs []idem.Message
			// Event times from 10 minutes past the cut-off to 10 minutes
			// before it, every 10 seconds; each claimed at its event time.
			for off := -10 * time.Minute; off <= 10*time.Minute; off += 10 * time.Second {
				e := now.Add(-window + off)
				m := idem.Message{ID: fmt.Sprintf("evt%+06.0f", off.Seconds()), Time: e, Body: []byte("{}")}
				insertMarker(t, pool, m.ID, ptr(e), e)
				msgs = append(msgs, m)
			}
			res, err := store.Prune(ctx, pgxinbox.PruneOptions{BatchSize: 7})
			if err != nil {
				t.Fatal(err)
			}
			if res.Markers == 0 || int(res.Markers) == len(msgs) {
				t.Fatalf("pruned %d of %d: the test needs markers on both sides of the cut-off", res.Markers, len(msgs))
			}
			p := processor(t, store, &idem.Horizon{Window: window, Skew: tc.skew, Now: func() time.Time { return time.Now().Add(-tc.behind) }})
			applied := 0
			for _, m := range msgs {
				switch r := p.Process(ctx, m); r.Outcome {
				case idem.Applied:
					applied++
				case idem.Duplicate, idem.Expired:
				default:
					t.Fatalf("%s: %v %v", m.ID, r.Outcome, r.Err)
				}
			}
			if tc.duplicates && applied == 0 {
				t.Fatalf("a consumer clock behind by more than the skew should let a pruned message through; the check is blind")
			}
			if !tc.duplicates && applied != 0 {
				t.Fatalf("%d messages whose markers were pruned were accepted and applied again", applied)
			}
		})
	}
}

// TestPruneConcurrentWithClaims: a prune with small batches runs while
// consumers claim new messages and redeliver recent ones. Every marker
// inside the window survives, every old one goes, and every message is
// applied exactly once.
func TestPruneConcurrentWithClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Plain, nil)
	now := dbNow(t, pool)
	// 20,000 old markers, written in one statement.
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until)
SELECT 'ledger', 'old-' || g, 'old-' || g, '\x00', t, t, t
FROM generate_series(1, 20000) g, LATERAL (SELECT $1::timestamptz - g * interval '1 second') v(t)`, now.Add(-window-time.Minute)); err != nil {
		t.Fatal(err)
	}
	p := processor(t, store, nil)
	const workers, perWorker = 4, 300
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var applied atomic.Int64
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				// Young and near the edge of the window, redelivered at once.
				e := time.Now().Add(-window + 10*time.Minute - time.Duration(i)*time.Second)
				batch := []idem.Message{
					{ID: fmt.Sprintf("new-%d-%d", w, i), Time: e, Body: []byte("{}")},
					{ID: fmt.Sprintf("new-%d-%d", w, i), Time: e, Body: []byte("{}")},
				}
				for _, r := range p.ProcessBatch(ctx, batch) {
					switch r.Outcome {
					case idem.Applied:
						applied.Add(1)
					case idem.Duplicate:
					default:
						errs <- fmt.Errorf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
						return
					}
				}
			}
		}()
	}
	var pruned int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			res, err := store.Prune(ctx, pgxinbox.PruneOptions{BatchSize: 500})
			if err != nil {
				errs <- err
				return
			}
			pruned += res.Markers
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	go func() { // stop pruning once the claims are done
		for applied.Load() < workers*perWorker && len(errs) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		close(stop)
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if pruned != 20000 {
		t.Fatalf("pruned %d, want the 20000 old markers", pruned)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox WHERE key LIKE 'new-%'`); n != workers*perWorker {
		t.Fatalf("markers inside the window = %d, want %d: the prune took some", n, workers*perWorker)
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM effects`); n != workers*perWorker {
		t.Fatalf("effects = %d, want %d", n, workers*perWorker)
	}
	// Every message again, after the prune: all duplicates.
	for w := range workers {
		for i := 0; i < perWorker; i += 37 {
			e := time.Now().Add(-window + 10*time.Minute)
			want(t, p.Process(ctx, idem.Message{ID: fmt.Sprintf("new-%d-%d", w, i), Time: e}), idem.Duplicate)
		}
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &recorder{}
	pool, store := openLayout(t, pgxinbox.Plain, rec)
	st, err := store.Stats(ctx)
	if err != nil || st.Rows != 0 || st.Headroom != window {
		t.Fatalf("empty inbox stats %+v %v", st, err)
	}
	now := dbNow(t, pool)
	overdue := now.Add(-window - 3*time.Hour)
	insertMarker(t, pool, "a", ptr(overdue), overdue)
	insertMarker(t, pool, "b", nil, now)
	st, err = store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != 2 || st.NoEventTime != 1 || st.Prunable != 1 || !st.Oldest.Equal(overdue) {
		t.Fatalf("stats %+v", st)
	}
	if st.Headroom > -3*time.Hour || st.Headroom < -4*time.Hour {
		t.Fatalf("headroom %v, want about -3h (the prune is three hours late)", st.Headroom)
	}
	if got := time.Duration(rec.oldest.Load()); got != st.OldestAge {
		t.Fatalf("hooks saw oldest age %v, want %v", got, st.OldestAge)
	}
}
