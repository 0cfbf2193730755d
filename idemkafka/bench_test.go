package idemkafka_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkPipeline consumes records spread over 6 partitions of kfake into
// PostgreSQL, one business row per record (one statement per batch), with
// the inbox claim and without
// it (a Natural processor: the same pipeline writing no marker), and reports
// each pipeline's msgs/s and what the claim costs. The two pipelines run in
// alternating order for several rounds and the medians are reported, so that
// a neighbour's load hits both alike. IDEM_BENCH_RECORDS sets the records
// per pass (default 20000; docs/performance.md uses 200000) and
// IDEM_BENCH_ROUNDS the rounds (default 3):
//
//	IDEM_BENCH_RECORDS=200000 go test -run '^$' -bench Pipeline -benchtime 1x ./idemkafka/
func BenchmarkPipeline(b *testing.B) {
	n, rounds := envInt(b, "IDEM_BENCH_RECORDS", 20000), envInt(b, "IDEM_BENCH_ROUNDS", 3)
	const parts = 6
	k := newKafka(b)
	topic := k.topic(b, "bench", parts)
	produce(b, k.client(b), topic, parts, 0, n, msgID)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	type pipeline struct {
		name  string
		db    *db
		proc  *idem.Processor[pgx.Tx]
		rates []float64
	}
	var pipes []*pipeline
	for _, natural := range []bool{false, true} {
		p := &pipeline{name: "claim", db: newDB(b)}
		if natural {
			p.name = "natural"
		}
		p.proc = p.db.processor(b, nil, nil, func(c *idem.Config[pgx.Tx]) {
			c.Logger = quiet
			// One row per record, written for the whole batch with one
			// statement, as a throughput-minded consumer would.
			c.Handler, c.HandleBatch = nil, writeBatch
			if natural {
				c.Key, c.Natural = nil, true
			}
		})
		pipes = append(pipes, p)
	}
	pass := 0
	consume := func(p *pipeline) float64 {
		pass++
		obs := newCommits(b, ends(n, parts))
		// The clock starts when the group assigned the partitions: joining
		// is not part of the pipeline's rate.
		var start atomic.Pointer[time.Time]
		assigned := kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			now := time.Now()
			start.CompareAndSwap(nil, &now)
		})
		cl := k.groupClient(b, k.group("bench"+strconv.Itoa(pass)), []string{topic}, assigned)
		c, err := idemkafka.NewConsumer(cl, p.proc, &idemkafka.Config{Hooks: []idem.Hook{obs}, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		stop := run(b, c)
		wait(b, obs.done, 10*time.Minute, "every partition committed")
		elapsed := time.Since(*start.Load())
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		cl.Close()
		if rows, distinct := p.db.effects(b); rows != n || distinct != n {
			b.Fatalf("%s: effects: %d rows, %d distinct; want %d", p.name, rows, distinct, n)
		}
		if _, err := p.db.pool.Exec(context.Background(), `TRUNCATE effects, idem_inbox`); err != nil {
			b.Fatal(err)
		}
		return float64(n) / elapsed.Seconds()
	}
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			order := []*pipeline{pipes[0], pipes[1]}
			if r%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, p := range order {
				p.rates = append(p.rates, consume(p))
			}
		}
	}
	claim, natural := median(pipes[0].rates), median(pipes[1].rates)
	b.ReportMetric(claim, "claim-msgs/s")
	b.ReportMetric(natural, "natural-msgs/s")
	b.ReportMetric(100*(1-claim/natural), "claim-cost-%")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d records over %d partitions, %d rounds: claim %s msgs/s, natural %s msgs/s", n, parts, len(pipes[0].rates), rates(pipes[0].rates), rates(pipes[1].rates))
}

// writeBatch is write for a whole batch in one statement.
func writeBatch(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
	ids := make([]string, len(msgs))
	sources := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i], sources[i] = m.ID, m.Source
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, source) SELECT * FROM unnest($1::text[], $2::text[])`, ids, sources)
	return err
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		b.Fatalf("%s=%q: want a positive number", name, s)
	}
	return v
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func rates(v []float64) string {
	s := make([]string, len(v))
	for i, r := range v {
		s[i] = strconv.FormatFloat(r, 'f', 0, 64)
	}
	return strings.Join(s, " ")
}

// BenchmarkDrain drains a topic of kfake into PostgreSQL, batch 100, one
// business row per record written with one statement per batch, over 1 and
// 2 partitions, three ways: handrolled (handDrain: the best hand-written
// franz-go and pgx consumer, strictly in sequence), handrolled-processor
// (the same loop around idem's processor) and idem (idemkafka, MaxBatch
// 100, a worker per partition). The three run in turn for several rounds,
// so that a neighbour's load hits each alike; the median rates are
// reported, and x_handrolled is the median over the rounds of a pipeline's
// rate over handrolled's in the same round. IDEM_BENCH_RECORDS
// sets the records (default 20000), IDEM_BENCH_ROUNDS the rounds (default
// 3):
//
//	IDEM_BENCH_RECORDS=50000 go test -run '^$' -bench 'Drain' -benchtime 1x ./idemkafka/
func BenchmarkDrain(b *testing.B) {
	for _, parts := range []int32{1, 2} {
		b.Run("partitions="+strconv.Itoa(int(parts)), func(b *testing.B) { benchDrain(b, parts) })
	}
}

func benchDrain(b *testing.B, parts int32) {
	n, rounds := envInt(b, "IDEM_BENCH_RECORDS", 20000), envInt(b, "IDEM_BENCH_ROUNDS", 3)
	k := newKafka(b)
	topic := k.topic(b, "drain", parts)
	produce(b, k.client(b), topic, parts, 0, n, msgID)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	type pipeline struct {
		name  string
		db    *db
		proc  *idem.Processor[pgx.Tx]
		rates []float64
	}
	var pipes []*pipeline
	for _, name := range []string{"handrolled", "handrolled-processor", "idem"} {
		p := &pipeline{name: name, db: newDB(b)}
		if _, err := p.db.pool.Exec(context.Background(), `CREATE TABLE processed_events (consumer text NOT NULL, message_id text NOT NULL, PRIMARY KEY (consumer, message_id))`); err != nil {
			b.Fatal(err)
		}
		p.proc = p.db.processor(b, nil, nil, func(c *idem.Config[pgx.Tx]) {
			c.Logger = quiet
			c.Handler, c.HandleBatch = nil, writeBatch
		})
		pipes = append(pipes, p)
	}
	pass := 0
	consume := func(p *pipeline) float64 {
		pass++
		var start atomic.Pointer[time.Time]
		assigned := kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			now := time.Now()
			start.CompareAndSwap(nil, &now)
		})
		cl := k.groupClient(b, k.group("drain"+strconv.Itoa(pass)), []string{topic}, assigned)
		var end time.Time
		switch p.name {
		case "idem":
			obs := newCommits(b, ends(n, parts))
			c, err := idemkafka.NewConsumer(cl, p.proc, &idemkafka.Config{MaxBatch: 100, Hooks: []idem.Hook{obs}, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			stop := run(b, c)
			wait(b, obs.done, 10*time.Minute, "every partition committed")
			end = time.Now()
			if err := stop(); err != nil {
				b.Fatal(err)
			}
		default:
			var proc *idem.Processor[pgx.Tx]
			if p.name == "handrolled-processor" {
				proc = p.proc
			}
			handDrain(b, cl, p.db, proc, n)
			end = time.Now()
		}
		elapsed := end.Sub(*start.Load())
		cl.Close()
		if rows, distinct := p.db.effects(b); rows != n || distinct != n {
			b.Fatalf("%s: effects: %d rows, %d distinct; want %d", p.name, rows, distinct, n)
		}
		if _, err := p.db.pool.Exec(context.Background(), `TRUNCATE effects, idem_inbox, processed_events`); err != nil {
			b.Fatal(err)
		}
		return float64(n) / elapsed.Seconds()
	}
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for i := range pipes {
				p := pipes[(i+r)%len(pipes)]
				p.rates = append(p.rates, consume(p))
			}
		}
	}
	// A ratio is the median of the rounds' ratios: the pipelines of one
	// round ran next to each other, under the same load.
	ratio := func(p, q *pipeline) float64 {
		r := make([]float64, len(p.rates))
		for i := range r {
			r[i] = p.rates[i] / q.rates[i]
		}
		return median(r)
	}
	for _, p := range pipes {
		b.ReportMetric(median(p.rates), p.name+"-msgs/s")
		if p != pipes[0] {
			b.ReportMetric(ratio(p, pipes[0]), p.name+"-x_handrolled")
		}
		b.Logf("%s: %s msgs/s", p.name, rates(p.rates))
	}
	b.ReportMetric(ratio(pipes[2], pipes[1]), "idem-x_handproc")
	b.ReportMetric(0, "ns/op")
}

// handDrain is the best batched inbox consumer one writes by hand with
// franz-go and pgx, strictly in sequence: poll up to 100 records, in one
// transaction claim their IDs with one statement in sorted order into
// processed_events and write the effect of the fresh ones with one more,
// commit, then commit the polled offsets, until n records are done. With
// proc, the transaction is the processor's ProcessBatch instead.
func handDrain(b *testing.B, cl *kgo.Client, d *db, proc *idem.Processor[pgx.Tx], n int) {
	ctx := context.Background()
	pc, err := d.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Release()
	var (
		ids, sources, fresh []string
		msgs                []idem.Message
		won                 = map[string]bool{}
	)
	for done := 0; done < n; {
		fs := cl.PollRecords(ctx, 100)
		if err := fs.Err0(); err != nil {
			b.Fatal(err)
		}
		recs := fs.Records()
		if len(recs) == 0 {
			cl.AllowRebalance()
			continue
		}
		if proc != nil {
			msgs = msgs[:0]
			for _, r := range recs {
				m := idem.Message{ID: string(r.Headers[0].Value), Source: r.Topic + "/" + strconv.Itoa(int(r.Partition)), Key: string(r.Key), Body: r.Value, Attempt: 1}
				// The time idemkafka gives a record without a time header.
				m.Time, m.TimeSource = idem.EventTime(m.ID, time.Time{}, r.Timestamp)
				msgs = append(msgs, m)
			}
			for _, res := range proc.ProcessBatchInOrder(ctx, msgs) {
				if res.Outcome != idem.Applied {
					b.Fatalf("%s: %v (%v)", res.MessageID, res.Outcome, res.Err)
				}
			}
		} else {
			ids, sources = ids[:0], sources[:0]
			for _, r := range recs {
				ids = append(ids, string(r.Headers[0].Value))
			}
			sorted := slices.Sorted(slices.Values(ids))
			tx, err := pc.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			rows, err := tx.Query(ctx, `INSERT INTO processed_events (consumer, message_id)
SELECT 'kafka-test', id FROM unnest($1::text[]) WITH ORDINALITY AS u(id, n) ORDER BY n
ON CONFLICT DO NOTHING RETURNING message_id`, sorted)
			if err != nil {
				b.Fatal(err)
			}
			fresh, err = pgx.AppendRows(fresh[:0], rows, pgx.RowTo[string])
			if err != nil {
				b.Fatal(err)
			}
			clear(won)
			for _, id := range fresh {
				won[id] = true
			}
			ids = ids[:0]
			for _, r := range recs {
				if id := string(r.Headers[0].Value); won[id] {
					ids, sources = append(ids, id), append(sources, r.Topic+"/"+strconv.Itoa(int(r.Partition)))
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, source) SELECT * FROM unnest($1::text[], $2::text[])`, ids, sources); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			b.Fatal(err)
		}
		cl.AllowRebalance()
		done += len(recs)
	}
}

// BenchmarkPositions is BenchmarkPipeline's claim pipeline with and without
// Config.Positions (PositionsRewind: one upsert of the partition's position
// per batch, in the batch's transaction), in alternating order in the same
// run, and reports each one's msgs/s and their ratio:
//
//	IDEM_BENCH_RECORDS=100000 go test -run '^$' -bench Positions -benchtime 1x ./idemkafka/
func BenchmarkPositions(b *testing.B) {
	n, rounds := envInt(b, "IDEM_BENCH_RECORDS", 20000), envInt(b, "IDEM_BENCH_ROUNDS", 3)
	const parts = 6
	k := newKafka(b)
	topic := k.topic(b, "benchpos", parts)
	produce(b, k.client(b), topic, parts, 0, n, msgID)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	type pipeline struct {
		name  string
		mode  idemkafka.Positions
		db    *db
		proc  *idem.Processor[pgx.Tx]
		rates []float64
	}
	var pipes []*pipeline
	for _, mode := range []idemkafka.Positions{idemkafka.PositionsOff, idemkafka.PositionsRewind} {
		p := &pipeline{name: mode.String(), mode: mode, db: newDB(b)}
		p.proc = p.db.processor(b, nil, nil, func(c *idem.Config[pgx.Tx]) {
			c.Logger = quiet
			c.Handler, c.HandleBatch = nil, writeBatch
		})
		pipes = append(pipes, p)
	}
	pass := 0
	consume := func(p *pipeline) float64 {
		pass++
		obs := newCommits(b, ends(n, parts))
		var start atomic.Pointer[time.Time]
		assigned := kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			now := time.Now()
			start.CompareAndSwap(nil, &now)
		})
		cl := k.groupClient(b, k.group("benchpos"+strconv.Itoa(pass)), []string{topic}, assigned)
		c, err := idemkafka.NewConsumer(cl, p.proc, &idemkafka.Config{Hooks: []idem.Hook{obs}, Logger: quiet, Positions: p.mode})
		if err != nil {
			b.Fatal(err)
		}
		stop := run(b, c)
		wait(b, obs.done, 10*time.Minute, "every partition committed")
		elapsed := time.Since(*start.Load())
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		cl.Close()
		if rows, distinct := p.db.effects(b); rows != n || distinct != n {
			b.Fatalf("%s: effects: %d rows, %d distinct; want %d", p.name, rows, distinct, n)
		}
		if _, err := p.db.pool.Exec(context.Background(), `TRUNCATE effects, idem_inbox, idem_inbox_positions`); err != nil {
			b.Fatal(err)
		}
		return float64(n) / elapsed.Seconds()
	}
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			order := []*pipeline{pipes[0], pipes[1]}
			if r%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, p := range order {
				p.rates = append(p.rates, consume(p))
			}
		}
	}
	off, on := median(pipes[0].rates), median(pipes[1].rates)
	b.ReportMetric(off, "off-msgs/s")
	b.ReportMetric(on, "positions-msgs/s")
	b.ReportMetric(on/off, "positions-x_off")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d records over %d partitions, %d rounds: off %s msgs/s, positions %s msgs/s", n, parts, len(pipes[0].rates), rates(pipes[0].rates), rates(pipes[1].rates))
}
