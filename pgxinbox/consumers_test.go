package pgxinbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// TestConsumerStats writes markers at known times for three consumers,
// one of which holds only markers newer than every other's, and reads
// each consumer's oldest marker, age, headroom and count back exactly.
func TestConsumerStats(t *testing.T) {
	t.Parallel()
	for _, layout := range []pgxinbox.Layout{pgxinbox.Plain, pgxinbox.Partitioned} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, store := openLayout(t, layout, nil)
			empty, err := store.ConsumerStats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(empty.Consumers) != 0 || empty.Window != window || empty.Table != "idem_inbox" {
				t.Fatalf("empty inbox: %+v", empty)
			}
			// Whole seconds, well inside the partitions Migrate created.
			base := dbNow(t, pool).Truncate(time.Second)
			at := func(ago time.Duration) time.Time { return base.Add(-ago) }
			type marker struct {
				consumer, key string
				t             time.Time
			}
			markers := []marker{
				{"ledger", "l-1", at(10 * 24 * time.Hour)},
				{"ledger", "l-2", at(2 * 24 * time.Hour)},
				{"ledger", "l-3", at(time.Hour)},
				{"invoices", "i-1", at(3 * 24 * time.Hour)},
				{"invoices", "i-2", at(5 * time.Minute)},
				{"stats", "s-1", at(2 * time.Minute)},
			}
			for _, m := range markers {
				q := `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until) VALUES ($1, $2, $2, '\x00', $3, $3, $3)`
				if layout == pgxinbox.Partitioned {
					q = `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until, partition_time) VALUES ($1, $2, $2, '\x00', $3, $3, $3, $3)`
				}
				if _, err := pool.Exec(ctx, q, m.consumer, m.key, m.t); err != nil {
					t.Fatal(err)
				}
			}
			got, err := store.ConsumerStats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			counts, err := store.ConsumerMarkers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(counts) != 3 {
				t.Errorf("counts %v, want three consumers", counts)
			}
			want := []struct {
				consumer string
				markers  int64
				oldest   time.Time
			}{
				{"invoices", 2, at(3 * 24 * time.Hour)},
				{"ledger", 3, at(10 * 24 * time.Hour)},
				{"stats", 1, at(2 * time.Minute)},
			}
			if len(got.Consumers) != len(want) {
				t.Fatalf("consumers %+v, want %d", got.Consumers, len(want))
			}
			if got.Now.Before(base) || got.Window != window {
				t.Fatalf("now %v (want after %v), window %v", got.Now, base, got.Window)
			}
			for i, w := range want {
				c := got.Consumers[i]
				if c.Consumer != w.consumer || !c.Oldest.Equal(w.oldest) {
					t.Errorf("consumer %d: %s, oldest %v; want %s, oldest %v", i, c.Consumer, c.Oldest, w.consumer, w.oldest)
				}
				if counts[w.consumer] != w.markers {
					t.Errorf("%s: %d markers counted, want %d", w.consumer, counts[w.consumer], w.markers)
				}
				if c.OldestAge != got.Now.Sub(w.oldest) || c.Headroom != window-c.OldestAge {
					t.Errorf("%s: age %v, headroom %v; want %v and %v", c.Consumer, c.OldestAge, c.Headroom,
						got.Now.Sub(w.oldest), window-got.Now.Sub(w.oldest))
				}
			}
		})
	}
}

// fillConsumers writes rows markers, shared evenly by consumers c0…c4,
// one every ten seconds back from now, plus 100 markers of a consumer
// that started a moment ago, and VACUUM ANALYZEs the table as autovacuum
// would.
func fillConsumers(tb testing.TB, pool *pgxpool.Pool, rows int) {
	tb.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until)
SELECT 'c' || (g % 5), md5(g::text), md5(g::text), sha256(int4send(g)), t, t, t
FROM generate_series(1, ` + strconv.Itoa(rows) + `) g, LATERAL (SELECT now() - g * (interval '10 days' / ` + strconv.Itoa(rows) + `) AS t) x`,
		`INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) SELECT 'new', 'k-' || g, 'k-' || g, '\x00' FROM generate_series(1, 100) g`,
		`VACUUM ANALYZE idem_inbox`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			tb.Fatal(err)
		}
	}
}

// tableScans reads how often the inbox was read by sequential and by
// index scans, after flushing this session's counters: the pool must
// have one connection, the one the store used.
func tableScans(tb testing.TB, pool *pgxpool.Pool) (seq, idx int64) {
	tb.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		tb.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relid = 'idem_inbox'::regclass`).Scan(&seq, &idx); err != nil {
		tb.Fatal(err)
	}
	return seq, idx
}

func singleConnStore(tb testing.TB) (*pgxpool.Pool, *pgxinbox.Store) {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.Schema(tb)+"&pool_max_conns=1")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Window: window})
	if err != nil {
		tb.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return pool, store
}

// TestConsumerStatsReadsIndexes checks, with the server's own scan
// counters, that reading the oldest markers of a table of 50,000 markers
// scans none of its rows sequentially, and finds the oldest marker of a
// consumer whose markers are all newer than every other consumer's.
func TestConsumerStatsReadsIndexes(t *testing.T) {
	t.Parallel()
	pool, store := singleConnStore(t)
	fillConsumers(t, pool, 50_000)
	newest := scalar[time.Time](t, pool, `SELECT min(keep_until) FROM idem_inbox WHERE consumer = 'new'`)
	seq0, idx0 := tableScans(t, pool)
	st, err := store.ConsumerStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seq1, idx1 := tableScans(t, pool)
	if len(st.Consumers) != 6 || st.Consumers[5].Consumer != "new" || !st.Consumers[5].Oldest.Equal(newest) {
		t.Fatalf("consumers: %+v, want c0…c4 and new, whose oldest marker is %v", st.Consumers, newest)
	}
	if seq1 != seq0 {
		t.Errorf("reading the oldest markers scanned the inbox sequentially %d times", seq1-seq0)
	}
	if idx1 == idx0 {
		t.Error("reading the oldest markers used no index of the inbox (the counters did not move)")
	}
}

// TestConsumerStatsPartitionedReadsOneDay reads the oldest markers of a
// partitioned inbox of 50,000 markers over ten days' partitions, with a
// consumer that started today, and checks with the server's counters that
// the read did not pass over the table: what it read sequentially is at
// most the oldest day and today's, a fifth of the markers.
func TestConsumerStatsPartitionedReadsOneDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Schema(t)+"&pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Window: window, Layout: pgxinbox.Partitioned})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until, partition_time)
SELECT 'c' || (g % 5), md5(g::text), md5(g::text), '\x00', t, t, t, t
FROM generate_series(1, 50000) g, LATERAL (SELECT now() - g * (interval '10 days' / 50000) AS t) x`,
		`INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, partition_time) SELECT 'new', 'k-' || g, 'k-' || g, '\x00', now(), now() FROM generate_series(1, 100) g`,
		`ANALYZE idem_inbox`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	scans := func() int64 {
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		return scalar[int64](t, pool, `SELECT coalesce(sum(s.seq_tup_read), 0)::bigint FROM pg_inherits i JOIN pg_stat_user_tables s ON s.relid = i.inhrelid WHERE i.inhparent = 'idem_inbox'::regclass`)
	}
	oldest := scalar[time.Time](t, pool, `SELECT min(partition_time) FROM idem_inbox WHERE consumer = 'c4'`)
	before := scans()
	st, err := store.ConsumerStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	read := scans() - before
	if read > 50_100/5 {
		t.Errorf("reading the oldest markers read %d of 50,100 markers sequentially", read)
	}
	t.Logf("read %d of 50,100 markers sequentially", read)
	if len(st.Consumers) != 6 || st.Consumers[4].Consumer != "c4" || !st.Consumers[4].Oldest.Equal(oldest) || st.Consumers[5].Consumer != "new" {
		t.Fatalf("consumers %+v, want c0…c4 (c4's oldest %v) and new", st.Consumers, oldest)
	}
}

// BenchmarkConsumerStats reads the per-consumer figures of an inbox of
// IDEM_BENCH_CONSUMER_ROWS markers (default 100,000; docs/performance.md's figures
// are for 1,000,000) over five consumers that share it evenly and one that
// started a moment ago:
//
//	IDEM_BENCH_CONSUMER_ROWS=1000000 go test -run '^$' -bench ConsumerStats -benchtime 20x ./pgxinbox/
//
// Oldest is what a scrape reads (ConsumerStats), with the sequential scans
// of the inbox it caused per read (seq-scans/op, from the server's
// counters); Markers is the count (ConsumerMarkers), a pass over the table.
func BenchmarkConsumerStats(b *testing.B) {
	rows := 100_000
	if s := os.Getenv("IDEM_BENCH_CONSUMER_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1000 {
			b.Fatalf("IDEM_BENCH_CONSUMER_ROWS=%q: want a number of at least 1000", s)
		}
		rows = n
	}
	ctx := context.Background()
	pool, store := singleConnStore(b)
	fillConsumers(b, pool, rows)
	b.Run("Oldest", func(b *testing.B) {
		seq0, _ := tableScans(b, pool)
		n := 0
		for b.Loop() {
			st, err := store.ConsumerStats(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(st.Consumers) != 6 {
				b.Fatalf("%d consumers", len(st.Consumers))
			}
			n++
		}
		b.StopTimer()
		seq1, _ := tableScans(b, pool)
		b.ReportMetric(float64(seq1-seq0)/float64(n), "seq-scans/op")
		b.Logf("%s markers over 6 consumers", fmt.Sprint(rows+100))
	})
	b.Run("Markers", func(b *testing.B) {
		for b.Loop() {
			counts, err := store.ConsumerMarkers(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(counts) != 6 {
				b.Fatalf("%d consumers", len(counts))
			}
		}
	})
}
