package pgxinbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/pgxinbox"
)

// growthCase is one layout with one kind of message ID. The partitioned
// layout takes its partition time from the key, so it runs on UUIDv7 IDs
// only.
type growthCase struct {
	layout pgxinbox.Layout
	keys   string // "v4" (random) or "v7" (time-ordered)
}

var growthCases = []growthCase{
	{pgxinbox.Plain, "v4"},
	{pgxinbox.Plain, "v7"},
	{pgxinbox.Partitioned, "v7"},
}

// growthInbox is one preloaded inbox under measurement.
type growthInbox struct {
	rows           int
	admin, pool    *pgxpool.Pool
	p              *idem.Processor[pgx.Tx]
	table, indexes int64 // bytes, every partition included
	before         map[string]blocks
	n              int
	elapsed        time.Duration
	rates          []float64 // per round
	// autovacuum and autoanalyze runs on the inbox, before the claims
	vacuums, analyzes int
}

// BenchmarkGrowth measures batched claim throughput (ProcessBatch, batches
// of 100, one set-based INSERT into an effects table per batch) on an inbox
// that already holds 0, 1M or 10M markers, plain and partitioned, with
// random (v4) and time-ordered (v7) message IDs, and reports each rate as a
// ratio to the empty inbox of the same case, measured in the same run. The
// preloads are IDEM_BENCH_GROWTH_ROWS (default "0,100000", for CI), the
// messages claimed on each inbox IDEM_BENCH_GROWTH_MESSAGES (default
// 20,000), in IDEM_BENCH_GROWTH_ROUNDS rounds (default 4) that take the
// inboxes in turn, so that a load which comes and goes on the machine
// falls on every inbox alike; the median of the rounds' ratios is reported
// next to the ratio of the totals. The README's figures come from
//
//	IDEM_BENCH_GROWTH_ROWS=0,1000000,10000000 IDEM_BENCH_GROWTH_MESSAGES=100000 IDEM_BENCH_GROWTH_ROUNDS=20 \
//	go test -run '^$' -bench Growth -benchtime 1x -timeout 120m -v ./pgxinbox/
//
// (-bench Growth/plain/keys=v4 for one case; PGOPTIONS='-c
// wal_compression=lz4' to try a server setting). Each preload fills a fresh
// inbox as a steady consumer would have left it: markers of the same
// consumer spread over the window (keys, write times, keep_until and,
// partitioned, partition times, which are the times inside the v7 keys),
// then VACUUM ANALYZE. idx-read/msg is the index blocks the claims had to
// read into shared_buffers per message; the log's table also says how many
// of the inbox's indexes they touched and their size, and what one claim
// of 1,000 keys costs right after a checkpoint (fpi/msg: full-page images
// per key).
func BenchmarkGrowth(b *testing.B) {
	preloads := growthPreloads(b)
	messages := growthEnv(b, "IDEM_BENCH_GROWTH_MESSAGES", 20_000, 100)
	rounds := growthEnv(b, "IDEM_BENCH_GROWTH_ROUNDS", 4, 1)
	const batch, warmup = 100, 10 * 100
	perRound := (messages/rounds + batch - 1) / batch * batch
	ctx := context.Background()
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nbatched claims (ProcessBatch, %d per batch, %d messages per inbox in %d rounds) as the inbox grows:\n", batch, perRound*rounds, rounds)
	sb.WriteString("| layout / keys | markers | msgs/s | ratio to 0 | median of round ratios (each round) | table | indexes | claimed indexes | index blocks read per msg (hit) | indexes touched | autovacuums, analyzes | after a checkpoint: FPI, WAL, blocks read per msg |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range growthCases {
		b.Run(fmt.Sprintf("%s/keys=%s", c.layout, c.keys), func(b *testing.B) {
			newID := idem.NewUUIDv7
			if c.keys == "v4" {
				newID = func(time.Time) string { return uuidv4() }
			}
			next := func(n int) []idem.Message {
				msgs := make([]idem.Message, n)
				for i := range msgs {
					now := time.Now()
					msgs[i] = idem.Message{ID: newID(now), Time: now, Body: []byte(`{"merchant_id":1,"amount":12500}`)}
				}
				return msgs
			}
			run := func(p *idem.Processor[pgx.Tx], msgs []idem.Message) {
				for i := 0; i < len(msgs); i += batch {
					for _, r := range p.ProcessBatch(ctx, msgs[i:min(i+batch, len(msgs))]) {
						if r.Outcome != idem.Applied {
							b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
						}
					}
				}
			}
			// The preload and the warm-up run on a pool of their own,
			// closed when done, and the claims on another, closed before
			// the block counts are read: a backend that exits has flushed
			// its statistics, so the counts are the claims' alone.
			inboxes := make([]*growthInbox, len(preloads))
			for i, rows := range preloads {
				admin, _ := openLayout(b, c.layout, nil)
				fill, store := growthPool(b, admin, c.layout)
				start := time.Now()
				preloadMarkers(b, fill, store, c, rows)
				run(growthProcessor(b, store), next(warmup))
				fill.Close()
				b.Logf("preloaded %d markers in %v", rows, time.Since(start).Round(time.Second))
				in := &growthInbox{rows: rows, admin: admin}
				if err := admin.QueryRow(ctx, `SELECT sum(pg_table_size(relid))::bigint, sum(pg_indexes_size(relid))::bigint FROM `+inboxRelations).Scan(&in.table, &in.indexes); err != nil {
					b.Fatal(err)
				}
				inboxes[i] = in
			}
			for _, in := range inboxes {
				in.before = indexBlocks(b, in.admin)
				in.vacuums, in.analyzes = autovacuums(b, in.admin)
				var store *pgxinbox.Store
				in.pool, store = growthPool(b, in.admin, c.layout)
				in.p = growthProcessor(b, store)
			}
			for b.Loop() {
				for r := range rounds {
					// Each round starts on another inbox.
					for j := range inboxes {
						in := inboxes[(r+j)%len(inboxes)]
						msgs := next(perRound)
						t0 := time.Now()
						run(in.p, msgs)
						d := time.Since(t0)
						in.elapsed += d
						in.n += perRound
						in.rates = append(in.rates, float64(perRound)/d.Seconds())
					}
				}
			}
			var base *growthInbox
			for _, in := range inboxes {
				if in.rows == 0 {
					base = in
				}
			}
			for _, in := range inboxes {
				in.pool.Close()
				after := indexBlocks(b, in.admin)
				var read, hit, hot int64
				touched := 0
				for name, a := range after {
					d := a.sub(in.before[name])
					read += d.read
					hit += d.hit
					if d.read+d.hit > 0 {
						touched++
						hot += a.size
					}
				}
				vacuums, analyzes := autovacuums(b, in.admin)
				probe := walProbe(b, in.admin, c.layout, newID)
				if got := scalar[int](b, in.admin, `SELECT count(*) FROM effects`); got != in.n+warmup {
					b.Fatalf("%d effects, want %d", got, in.n+warmup)
				}
				rate := float64(in.n) / in.elapsed.Seconds()
				label := strconv.Itoa(in.rows)
				b.ReportMetric(rate, "msgs/s@"+label)
				b.ReportMetric(float64(read)/float64(in.n), "idx-read/msg@"+label)
				ratio, rounds := "-", "-"
				if base != nil {
					ratio = fmt.Sprintf("%.2f", rate*base.elapsed.Seconds()/float64(base.n))
					b.ReportMetric(rate*base.elapsed.Seconds()/float64(base.n), "ratio@"+label)
					// Each round's ratio pairs two inboxes measured moments
					// apart; their median shrugs off a round that a passing
					// load slowed.
					var rs []string
					paired := make([]float64, len(in.rates))
					for k, x := range in.rates {
						paired[k] = x / base.rates[k]
						rs = append(rs, fmt.Sprintf("%.2f", paired[k]))
					}
					slices.Sort(paired)
					median := (paired[(len(paired)-1)/2] + paired[len(paired)/2]) / 2
					b.ReportMetric(median, "median-ratio@"+label)
					rounds = fmt.Sprintf("%.2f (%s)", median, strings.Join(rs, " "))
				}
				b.ReportMetric(probe.fpi, "fpi/msg@"+label)
				fmt.Fprintf(&sb, "| %s/keys=%s | %d | %.0f | %s | %s | %s | %s | %s | %.2f (%.1f) | %d of %d | %d, %d | %.2f, %.0f B, %.2f |\n",
					c.layout, c.keys, in.rows, rate, ratio, rounds, mib(in.table), mib(in.indexes), mib(hot),
					float64(read)/float64(in.n), float64(hit)/float64(in.n), touched, len(after),
					vacuums-in.vacuums, analyzes-in.analyzes, probe.fpi, probe.wal, probe.read)
			}
		})
	}
	b.Log(sb.String())
}

// autovacuums counts the autovacuum and autoanalyze runs on the inbox and
// its partitions so far.
func autovacuums(b *testing.B, pool *pgxpool.Pool) (vacuums, analyzes int) {
	b.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(autovacuum_count), 0)::int, coalesce(sum(autoanalyze_count), 0)::int
FROM pg_stat_user_tables s JOIN `+inboxRelations+` ON t.relid = s.relid`).Scan(&vacuums, &analyzes); err != nil {
		b.Fatal(err)
	}
	return vacuums, analyzes
}

// probeResult is the cost of one claim statement, per key.
type probeResult struct{ fpi, wal, read float64 }

// walProbe runs the store's claim statement for 1,000 fresh keys right
// after a CHECKPOINT, under EXPLAIN (ANALYZE, BUFFERS, WAL), and rolls it
// back: the full-page images, WAL bytes and blocks read per key of a claim
// that meets every page for the first time since the checkpoint, counted
// for this statement alone (the server's other work does not enter).
func walProbe(b *testing.B, pool *pgxpool.Pool, layout pgxinbox.Layout, newID func(time.Time) string) probeResult {
	b.Helper()
	ctx := context.Background()
	const n = 1000
	keys := make([]string, n)
	hashes := make([][]byte, n)
	times := make([]time.Time, n)
	parts := make([]time.Time, n)
	for i := range keys {
		now := time.Now()
		keys[i], times[i], hashes[i] = newID(now), now, make([]byte, 32)
		parts[i], _ = idem.TimeFromUUIDv7(keys[i])
		_, _ = rand.Read(hashes[i])
	}
	slices.Sort(keys) // as the processor sends them
	args := []any{"ledger", keys, keys, hashes, times}
	if layout == pgxinbox.Partitioned {
		args = append(args, parts)
	}
	claim := inboxdb.Postgres(inboxdb.Table{Name: "idem_inbox"}, layout).Claim.SQL
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		b.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []struct {
		Plan struct {
			FPI  float64 `json:"WAL FPI"`
			WAL  float64 `json:"WAL Bytes"`
			Read float64 `json:"Shared Read Blocks"`
		}
	}
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) `+claim, args...).Scan(&plan); err != nil {
		b.Fatal(err)
	}
	if len(plan) != 1 {
		b.Fatalf("EXPLAIN gave %d plans", len(plan))
	}
	return probeResult{plan[0].Plan.FPI / n, plan[0].Plan.WAL / n, plan[0].Plan.Read / n}
}

// growthEnv reads a count from the environment, def when unset.
func growthEnv(b *testing.B, name string, def, least int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < least {
		b.Fatalf("%s=%q: want a number of at least %d", name, s, least)
	}
	return n
}

// growthPreloads parses IDEM_BENCH_GROWTH_ROWS.
func growthPreloads(b *testing.B) []int {
	s := os.Getenv("IDEM_BENCH_GROWTH_ROWS")
	if s == "" {
		s = "0,100000"
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			b.Fatalf("IDEM_BENCH_GROWTH_ROWS=%q: want a comma-separated list of marker counts", s)
		}
		out = append(out, n)
	}
	return out
}

// growthPool opens a pool of its own on admin's schema, and a store on it.
func growthPool(b *testing.B, admin *pgxpool.Pool, layout pgxinbox.Layout) (*pgxpool.Pool, *pgxinbox.Store) {
	b.Helper()
	pool, err := pgxpool.New(context.Background(), admin.Config().ConnString())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: layout})
	if err != nil {
		b.Fatal(err)
	}
	return pool, store
}

// inboxRelations is the inbox table and its partitions, as t(relid).
const inboxRelations = `(SELECT 'idem_inbox'::regclass AS relid UNION SELECT relid FROM pg_partition_tree('idem_inbox')) t`

// blocks is an index's block counters and size.
type blocks struct{ read, hit, size int64 }

func (a blocks) sub(b blocks) blocks { return blocks{a.read - b.read, a.hit - b.hit, a.size} }

// indexBlocks reads the block counters of the inbox's indexes (each
// partition's), by index name, once the backends of closed pools have
// exited and flushed theirs. It reads twice: the first read's transaction
// flushes what pool's own connection still held.
func indexBlocks(b *testing.B, pool *pgxpool.Pool) map[string]blocks {
	b.Helper()
	time.Sleep(1100 * time.Millisecond)
	indexBlocksNow(b, pool)
	return indexBlocksNow(b, pool)
}

func indexBlocksNow(b *testing.B, pool *pgxpool.Pool) map[string]blocks {
	b.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT s.indexrelname::text, coalesce(s.idx_blks_read, 0), coalesce(s.idx_blks_hit, 0), pg_relation_size(s.indexrelid)
FROM pg_statio_user_indexes s JOIN `+inboxRelations+` ON t.relid = s.relid`)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]blocks{}
	for rows.Next() {
		var name string
		var x blocks
		if err := rows.Scan(&name, &x.read, &x.hit, &x.size); err != nil {
			b.Fatal(err)
		}
		out[name] = x
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return out
}

func growthProcessor(b *testing.B, store *pgxinbox.Store) *idem.Processor[pgx.Tx] {
	b.Helper()
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger",
		Key:      idem.ByMessageID,
		Horizon:  idem.Horizon{Window: window},
		HandleBatch: func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.ID
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects SELECT 'ledger', id, id FROM unnest($1::text[]) AS id`, ids)
			return err
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// growthChunk is how many markers one preload statement writes.
const growthChunk = 500_000

// preloadMarkers writes rows markers of consumer "ledger" into the inbox,
// oldest first, their times spread evenly over the window that ends now:
// write time, keep_until and event time alike, and on the partitioned
// layout the partition time, which is the time inside a v7 key (partitions
// for every day are created first, with EnsurePartitions). Keys are UUID
// strings as the benchmark's messages carry: random v4, or v7 with the
// marker's time. Then VACUUM ANALYZE, as autovacuum would have by then.
func preloadMarkers(b *testing.B, pool *pgxpool.Pool, store *pgxinbox.Store, c growthCase, rows int) {
	b.Helper()
	ctx := context.Background()
	now := dbNow(b, pool)
	from := now.Add(-window)
	if c.layout == pgxinbox.Partitioned {
		if _, err := store.EnsurePartitions(ctx, from, int(window/(24*time.Hour))+1+pgxinbox.DefaultDaysAhead); err != nil {
			b.Fatal(err)
		}
	}
	// gen_random_uuid() is a v4 UUID; a v7 one keeps its random tail and
	// puts the marker's Unix milliseconds and version 7 in front.
	key := `gen_random_uuid()::text`
	if c.keys == "v7" {
		key = `(SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 16)
        FROM (SELECT lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') AS h, gen_random_uuid()::text AS r) x)`
	}
	partCol, partVal := "", ""
	if c.layout == pgxinbox.Partitioned {
		// The processor's partition time: the key's time, to the millisecond.
		partCol, partVal = ", partition_time", ", date_trunc('milliseconds', t)"
	}
	// OFFSET 0 keeps the key a column of the subquery, drawn once per row
	// for both key and message_id.
	insert := `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until` + partCol + `)
SELECT 'ledger', k, k, sha256(int8send(g)), t, t, t` + partVal + `
FROM (SELECT g, t, ` + key + ` AS k
      FROM generate_series($1::bigint, $2::bigint) g,
           LATERAL (SELECT $3::timestamptz + g * ($4::interval / $5::bigint) AS t) a
      OFFSET 0) s`
	for lo := 0; lo < rows; lo += growthChunk {
		hi := min(lo+growthChunk, rows) - 1
		if _, err := pool.Exec(ctx, insert, lo, hi, from, window, rows); err != nil {
			b.Fatal(err)
		}
	}
	if rows > 0 {
		if got := scalar[int](b, pool, `SELECT count(*) FROM idem_inbox WHERE consumer = 'ledger'`); got != rows {
			b.Fatalf("preloaded %d markers, want %d", got, rows)
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE idem_inbox`); err != nil {
		b.Fatal(err)
	}
}

// uuidv4 is a random (version 4) UUID string.
func uuidv4() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
