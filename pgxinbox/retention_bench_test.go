package pgxinbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/pgxinbox"
)

// BenchmarkRetention removes the oldest of seven days of markers, both ways,
// in the same run: DROP of a daily partition against batched DELETE (plus
// the VACUUM the DELETE leaves behind), as time and WAL bytes; and claim
// throughput while the batched DELETE runs against the same table idle. The
// size is IDEM_BENCH_RETENTION_ROWS (default 70,000, for CI); docs/performance.md's
// figures come from
//
//	IDEM_BENCH_RETENTION_ROWS=5000000 go test -run '^$' -bench Retention -benchtime 1x -timeout 60m ./pgxinbox/
//
// WAL is measured with pg_current_wal_lsn, which counts the whole server:
// run it on a quiet server. Each removal starts right after a CHECKPOINT, so
// both pay the same full-page images.
func BenchmarkRetention(b *testing.B) {
	rows := 70_000
	if s := os.Getenv("IDEM_BENCH_RETENTION_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 7000 {
			b.Fatalf("IDEM_BENCH_RETENTION_ROWS=%q: want a number of at least 7000", s)
		}
		rows = n
	}
	for b.Loop() {
		drop := measureDrop(b, rows)
		del := measureDelete(b, rows)
		b.ReportMetric(drop.seconds, "drop-s")
		b.ReportMetric(float64(drop.wal), "drop-wal-B")
		b.ReportMetric(del.seconds, "delete-s")
		b.ReportMetric(float64(del.wal), "delete-wal-B")
		b.ReportMetric(del.vacuumSeconds, "vacuum-s")
		b.ReportMetric(float64(del.vacuumWAL), "vacuum-wal-B")
		b.ReportMetric(del.idleRate, "idle-claims/s")
		b.ReportMetric(del.busyRate, "pruning-claims/s")
		b.Logf("\n%d markers over 7 days, removing the oldest day (%d markers):\n"+
			"| method | time | WAL |\n|---|---|---|\n"+
			"| DROP partition | %.3f s | %s |\n"+
			"| batched DELETE (%d batches of 5,000) | %.2f s | %s |\n"+
			"| VACUUM after the DELETE | %.2f s | %s |\n"+
			"claims (batches of 100, one worker): idle %.0f msg/s, while the DELETE runs %.0f msg/s (%.0f%%)",
			rows, del.markers, drop.seconds, mib(drop.wal), del.batches, del.seconds, mib(del.wal),
			del.vacuumSeconds, mib(del.vacuumWAL), del.idleRate, del.busyRate, 100*del.busyRate/del.idleRate)
	}
}

func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

type removal struct {
	seconds, vacuumSeconds float64
	wal, vacuumWAL         int64
	markers                int64
	batches                int
	idleRate, busyRate     float64
}

// fill writes rows markers over seven days: a seventh of them spread over
// the UTC day first, which is entirely past the window, the rest over the six
// days that start an hour inside the window. Both removals then take exactly
// the first day. processed_at and keep_until are a second after each event
// time, which is also the partition time of the partitioned layout.
func fill(b *testing.B, pool *pgxpool.Pool, layout pgxinbox.Layout, rows int, first time.Time) {
	b.Helper()
	ctx := context.Background()
	young := scalar[time.Time](b, pool, `SELECT now()`).Add(-window + time.Hour)
	partCol, partVal := "", ""
	if layout == pgxinbox.Partitioned {
		partCol, partVal = ", partition_time", ", t"
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until`+partCol+`)
SELECT 'ledger', k, k, sha256(int4send(g)), t, t + interval '1 second', t + interval '1 second'`+partVal+`
FROM generate_series(0, $1 - 1) g,
     LATERAL (SELECT md5(g::text) AS k,
                     CASE WHEN g < $1 / 7 THEN $2::timestamptz + g * (interval '1 day' / ($1 / 7))
                          ELSE $3::timestamptz + (g - $1 / 7) * (interval '6 days' / ($1 - $1 / 7)) END AS t) x`,
		rows, first, young); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{`VACUUM ANALYZE idem_inbox`, `CHECKPOINT`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
}

// walDelta runs f and returns its duration and the WAL the server wrote.
func walDelta(b *testing.B, pool *pgxpool.Pool, f func()) (float64, int64) {
	b.Helper()
	ctx := context.Background()
	var before string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&before); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	f()
	elapsed := time.Since(start).Seconds()
	var wal int64
	if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, before).Scan(&wal); err != nil {
		b.Fatal(err)
	}
	return elapsed, wal
}

func firstDay(b *testing.B, pool *pgxpool.Pool) time.Time {
	b.Helper()
	// The oldest day ends an hour before the cut-off, whole.
	now := scalar[time.Time](b, pool, `SELECT now()`)
	return now.UTC().Add(-window - time.Hour).Truncate(24 * time.Hour).Add(-24 * time.Hour)
}

func measureDrop(b *testing.B, rows int) removal {
	ctx := context.Background()
	pool, store := openLayout(b, pgxinbox.Partitioned, nil)
	first := firstDay(b, pool)
	if _, err := store.EnsurePartitions(ctx, first, 10); err != nil {
		b.Fatal(err)
	}
	fill(b, pool, pgxinbox.Partitioned, rows, first)
	var res []string
	secs, wal := walDelta(b, pool, func() {
		r, err := store.Prune(ctx, pgxinbox.PruneOptions{})
		if err != nil {
			b.Fatal(err)
		}
		res = r.Partitions
	})
	if len(res) != 1 {
		b.Fatalf("dropped %v, want the oldest day", res)
	}
	if n := scalar[int](b, pool, `SELECT count(*) FROM idem_inbox`); n != rows-rows/7 {
		b.Fatalf("%d markers left after the drop, want %d", n, rows-rows/7)
	}
	return removal{seconds: secs, wal: wal}
}

func measureDelete(b *testing.B, rows int) removal {
	ctx := context.Background()
	pool, store := openLayout(b, pgxinbox.Plain, nil)
	if _, err := pool.Exec(ctx, `ALTER TABLE idem_inbox SET (autovacuum_enabled = false)`); err != nil {
		b.Fatal(err)
	}
	first := firstDay(b, pool)
	fill(b, pool, pgxinbox.Plain, rows, first)
	p := processor(b, store, nil)
	var seq atomic.Int64
	claim := func() int {
		msgs := make([]idem.Message, 100)
		for i := range msgs {
			msgs[i] = idem.Message{ID: "bench-" + strconv.FormatInt(seq.Add(1), 10), Time: time.Now(), Body: []byte("{}")}
		}
		for _, r := range p.ProcessBatch(ctx, msgs) {
			if r.Outcome != idem.Applied {
				b.Fatalf("claim: %v %v", r.Outcome, r.Err)
			}
		}
		return len(msgs)
	}
	var out removal
	// Claims on the idle table, for as long as a prune of this size takes
	// at least, then the prune alone.
	start, n := time.Now(), 0
	for time.Since(start) < 3*time.Second {
		n += claim()
	}
	out.idleRate = float64(n) / time.Since(start).Seconds()
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		b.Fatal(err)
	}
	out.seconds, out.wal = walDelta(b, pool, func() {
		r, err := store.Prune(ctx, pgxinbox.PruneOptions{})
		if err != nil {
			b.Fatal(err)
		}
		out.markers, out.batches = r.Markers, r.Batches
	})
	if out.markers != int64(rows/7) {
		b.Fatalf("deleted %d markers, want the oldest day's %d", out.markers, rows/7)
	}
	out.vacuumSeconds, out.vacuumWAL = walDelta(b, pool, func() {
		if _, err := pool.Exec(ctx, `VACUUM idem_inbox`); err != nil {
			b.Fatal(err)
		}
	})

	// The oldest day again, then claims while the prune removes it.
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until)
SELECT 'ledger', k, k, sha256(int4send(g)), t, t + interval '1 second', t + interval '1 second'
FROM generate_series(0, $1 / 7 - 1) g,
     LATERAL (SELECT 'again-' || md5(g::text) AS k, $2::timestamptz + g * (interval '1 day' / ($1 / 7)) AS t) x`, rows, first); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE idem_inbox`); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := store.Prune(ctx, pgxinbox.PruneOptions{})
		done <- err
	}()
	start, n = time.Now(), 0
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				b.Fatal(err)
			}
			running = false
		default:
			n += claim()
		}
	}
	out.busyRate = float64(n) / time.Since(start).Seconds()
	return out
}
