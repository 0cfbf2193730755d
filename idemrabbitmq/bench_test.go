package idemrabbitmq_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
)

// drainMessages is how many persistent messages BenchmarkDrain drains per
// run. The figure in docs/performance.md uses 100,000:
//
//	go test -run '^$' -bench Drain -benchtime 1x ./idemrabbitmq/ -args -drain.messages=100000
var drainMessages = flag.Int("drain.messages", envInt("IDEM_BENCH_MESSAGES", 20000), "messages per BenchmarkDrain run (env IDEM_BENCH_MESSAGES)")

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// rawRate is the raw drain's msgs/s, so the idem runs can report their
// ratio to it measured in the same process.
var rawRate float64

// BenchmarkDrain drains a quorum queue of persistent messages: raw (consume
// and ack, batch 100, prefetch 500, no database); a hand-rolled batched
// inbox consumer (handDrain, one worker, strictly in sequence) with the
// one-statement batch write (handrolled) and with a row per message
// (handrolled-row); the same loop around idem's processor
// (handrolled-processor); then through idemrabbitmq into PostgreSQL (claim
// plus a one-row business write per message, batch 100, prefetch 500) with
// 1 and 4 workers, with the batch write through Config.HandleBatch with 1
// and 2 workers, and with the claim alone (no business write) to separate
// the adapter's cost from the handler's round trips. Publishing is not
// timed.
//
// Each idem run reports x_raw, its rate over the raw drain's, and
// x_handrolled, its rate over a hand-rolled drain with the same write run
// next to it (before or after it, in turn), so that a neighbour's load on
// the machine hits both alike; the batch-write runs also report
// x_handproc, over handrolled-processor run next to them: what the
// adapter adds or saves around the processor.
func BenchmarkDrain(b *testing.B) {
	n := *drainMessages
	b.Run("raw", func(b *testing.B) {
		for range b.N {
			conn := broker(b)
			topo := topology(b, conn, nil)
			publish(b, conn, topo.Queue, 0, n, msgID)
			b.ResetTimer()
			start := time.Now()
			rawDrain(b, conn, topo.Queue, n)
			elapsed := time.Since(start)
			b.StopTimer()
			rawRate = float64(n) / elapsed.Seconds()
			b.ReportMetric(rawRate, "msgs/s")
		}
	})
	for _, h := range []handKind{handBatch, handRow, handProcessor} {
		b.Run(h.String(), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				rate, cpu := handRun(b, h, n, true)
				b.ReportMetric(rate, "msgs/s")
				b.ReportMetric(cpu, "cpu-us/msg")
				if rawRate > 0 {
					b.ReportMetric(rate/rawRate, "x_raw")
				}
			}
		})
	}
	turn := 0
	for _, v := range []struct {
		name    string
		workers int
		write   bool
	}{{"idem", 1, true}, {"idem", 4, true}, {"idem-batch-write", 1, true}, {"idem-batch-write", 2, true}, {"idem-claim-only", 1, false}} {
		workers := v.workers
		b.Run(fmt.Sprintf("%s/workers=%d", v.name, workers), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				var pairs []handKind
				switch {
				case v.name == "idem-batch-write":
					pairs = []handKind{handBatch, handProcessor}
				case v.write:
					pairs = []handKind{handRow}
				}
				turn++
				paired := make([]float64, len(pairs))
				pairedCPU := make([]float64, len(pairs))
				if turn%2 == 1 {
					for i, h := range pairs {
						paired[i], pairedCPU[i] = handRun(b, h, n, false)
					}
				}
				conn := broker(b)
				topo := topology(b, conn, nil)
				d := newDB(b, "idemrabbitmq-bench")
				h := write
				if !v.write {
					// The adapter and the claim alone: what a batch business
					// write would approach.
					h = func(context.Context, pgx.Tx, idem.Message) error { return nil }
				}
				var mods []func(*idem.Config[pgx.Tx])
				if v.name == "idem-batch-write" {
					// The same one row per message, written for the whole
					// batch with one statement through Config.HandleBatch.
					mods = append(mods, func(c *idem.Config[pgx.Tx]) { c.Handler, c.HandleBatch = nil, writeBatch })
				}
				proc := d.processor(b, h, mods...)
				publish(b, conn, topo.Queue, 0, n, msgID)
				cfg := config(b, topo.Queue)
				cfg.BatchSize, cfg.Prefetch, cfg.Workers = 100, 500, workers
				acks := &countAcks{want: uint64(n), done: make(chan struct{})}
				cfg.Hooks = []idem.Hook{acks}
				c, err := idemrabbitmq.NewConsumer(proc, cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start, cpu0 := time.Now(), cpuTime()
				stop := run(b, c)
				select {
				case <-acks.done:
				case <-time.After(10 * time.Minute):
					b.Fatal("drain did not finish in 10 minutes")
				}
				elapsed, cpuUsed := time.Since(start), cpuTime()-cpu0
				b.StopTimer()
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				if rows, _ := d.effects(b); v.write && rows != n {
					b.Fatalf("effects %d, want %d", rows, n)
				}
				if turn%2 == 0 {
					for i, h := range pairs {
						paired[i], pairedCPU[i] = handRun(b, h, n, false)
					}
				}
				rate, cpu := float64(n)/elapsed.Seconds(), float64(cpuUsed.Microseconds())/float64(n)
				b.ReportMetric(rate, "msgs/s")
				b.ReportMetric(cpu, "cpu-us/msg")
				if rawRate > 0 {
					b.ReportMetric(rate/rawRate, "x_raw")
				}
				for i, h := range pairs {
					unit := "x_handrolled"
					if h == handProcessor {
						unit = "x_handproc"
					}
					b.ReportMetric(rate/paired[i], unit)
					if h == handBatch || h == handRow {
						b.ReportMetric(cpu/pairedCPU[i], "cpu_x_handrolled")
					}
				}
			}
		})
	}
}

// cpuTime is the CPU time this process has used, user and system: the
// drains' cpu-us/msg is less at the mercy of a loaded machine than their
// rate.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// handKind is a hand-rolled drain's transaction.
type handKind int

const (
	handBatch     handKind = iota // the claim, then one statement writes the batch's rows
	handRow                       // the claim, then one statement per row, as write
	handProcessor                 // idem's processor, writeBatch through HandleBatch
)

func (h handKind) String() string {
	return [...]string{"handrolled", "handrolled-row", "handrolled-processor"}[h]
}

// handRun publishes n messages to a queue of their own and drains them with
// handDrain or handProcDrain into a schema of their own; it returns the
// drain's msgs/s and the process's CPU microseconds per message. With
// timed, the drain runs on b's timer.
func handRun(b *testing.B, h handKind, n int, timed bool) (rate, cpuPerMsg float64) {
	conn := broker(b)
	topo := topology(b, conn, nil)
	d := newDB(b, "idemrabbitmq-bench")
	if _, err := d.pool.Exec(context.Background(), `CREATE TABLE processed_events (consumer text NOT NULL, message_id text NOT NULL, PRIMARY KEY (consumer, message_id))`); err != nil {
		b.Fatal(err)
	}
	var proc *idem.Processor[pgx.Tx]
	if h == handProcessor {
		proc = d.processor(b, nil, func(c *idem.Config[pgx.Tx]) { c.Handler, c.HandleBatch = nil, writeBatch })
	}
	publish(b, conn, topo.Queue, 0, n, msgID)
	if timed {
		b.StartTimer()
	}
	start, cpu0 := time.Now(), cpuTime()
	if proc != nil {
		handProcDrain(b, conn, proc, topo.Queue, n)
	} else {
		handDrain(b, conn, d, topo.Queue, n, h == handRow)
	}
	elapsed, cpuUsed := time.Since(start), cpuTime()-cpu0
	if timed {
		b.StopTimer()
	}
	if rows, distinct := d.effects(b); rows != n || distinct != n {
		b.Fatalf("%s: effects: %d rows, %d distinct; want %d", h, rows, distinct, n)
	}
	return float64(n) / elapsed.Seconds(), float64(cpuUsed.Microseconds()) / float64(n)
}

// handDrain is the best batched inbox consumer one writes by hand with
// amqp091 and pgx, with one worker and strictly in sequence: it collects
// up to 100 deliveries (a partial batch once 20ms pass without one), then
// in one transaction claims their IDs with one statement in sorted order
// into processed_events, writes the effect of each fresh one (one
// statement for the batch, or with perRow one per message, as write
// does), commits, and acks the batch with one multiple ack.
func handDrain(b *testing.B, conn *amqp.Connection, d *db, queue string, n int, perRow bool) {
	ctx := context.Background()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Qos(500, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	pc, err := d.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Release()
	const batch = 100
	var (
		last  uint64
		ids   = make([]string, 0, batch)
		fresh = make([]string, 0, batch)
		tries = make([]int32, 0, batch)
		wait  = time.NewTimer(time.Hour)
	)
	for done := 0; done < n; {
		ids = ids[:0]
		m := <-ds
		ids, last = append(ids, m.MessageId), m.DeliveryTag
		wait.Reset(20 * time.Millisecond)
	collect:
		for len(ids) < batch {
			select {
			case m := <-ds:
				ids, last = append(ids, m.MessageId), m.DeliveryTag
			case <-wait.C:
				break collect
			}
		}
		wait.Stop()
		slices.Sort(ids)
		tx, err := pc.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		rows, err := tx.Query(ctx, `INSERT INTO processed_events (consumer, message_id)
SELECT 'billing-invoice', id FROM unnest($1::text[]) WITH ORDINALITY AS u(id, n) ORDER BY n
ON CONFLICT DO NOTHING RETURNING message_id`, ids)
		if err != nil {
			b.Fatal(err)
		}
		fresh, err = pgx.AppendRows(fresh[:0], rows, pgx.RowTo[string])
		if err != nil {
			b.Fatal(err)
		}
		if perRow {
			for _, id := range fresh {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (key, message_id, attempt) VALUES ($1, $2, $3)`, id, id, 1); err != nil {
					b.Fatal(err)
				}
			}
		} else {
			tries = tries[:0]
			for range fresh {
				tries = append(tries, 1)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects (key, message_id, attempt)
SELECT k, k, a FROM unnest($1::text[], $2::int[]) AS t(k, a)`, fresh, tries); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		if err := ch.Ack(last, true); err != nil {
			b.Fatal(err)
		}
		done += len(ids)
	}
}

// writeBatch is write for a whole batch in one statement.
func writeBatch(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
	keys := make([]string, len(msgs))
	attempts := make([]int32, len(msgs))
	for i, m := range msgs {
		keys[i], attempts[i] = m.ID, int32(m.Attempt)
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (key, message_id, attempt)
SELECT k, k, a FROM unnest($1::text[], $2::int[]) AS t(k, a)`, keys, attempts)
	return err
}

// rawDrain consumes n messages and acks each 100 with one multiple ack:
// the broker's cost without a database.
func rawDrain(b *testing.B, conn *amqp.Connection, queue string, n int) {
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Qos(500, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		d := <-ds
		if i%100 == 0 || i == n {
			if err := d.Ack(true); err != nil {
				b.Fatal(err)
			}
		}
	}
}

type countAcks struct {
	acked atomic.Uint64
	want  uint64
	done  chan struct{}
}

func (c *countAcks) OnSettle(_, _ string, d idem.Disposition, _ idem.Result) {
	v := idemrabbitmq.VerbFor(d.Action)
	if v == idemrabbitmq.Ack && c.acked.Add(1) == c.want {
		close(c.done)
	}
}

// handProcDrain is handDrain with idem's processor for the transaction:
// collect up to 100 deliveries, ProcessBatch, one multiple ack when every
// message was acked, in sequence.
func handProcDrain(b *testing.B, conn *amqp.Connection, proc *idem.Processor[pgx.Tx], queue string, n int) {
	ctx := context.Background()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Qos(500, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	const batch = 100
	var (
		last uint64
		msgs = make([]idem.Message, 0, batch)
		wait = time.NewTimer(time.Hour)
	)
	for done := 0; done < n; {
		msgs = msgs[:0]
		m := <-ds
		msgs, last = append(msgs, idemrabbitmq.Message(&m, queue, "")), m.DeliveryTag
		wait.Reset(20 * time.Millisecond)
	collect:
		for len(msgs) < batch {
			select {
			case m := <-ds:
				msgs, last = append(msgs, idemrabbitmq.Message(&m, queue, "")), m.DeliveryTag
			case <-wait.C:
				break collect
			}
		}
		wait.Stop()
		for _, r := range proc.ProcessBatch(ctx, msgs) {
			if r.Outcome != idem.Applied {
				b.Fatalf("%s: %v (%v)", r.MessageID, r.Outcome, r.Err)
			}
		}
		if err := ch.Ack(last, true); err != nil {
			b.Fatal(err)
		}
		done += len(msgs)
	}
}
