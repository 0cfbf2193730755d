package idemrabbitmq_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
)

// drainMessages is how many persistent messages BenchmarkDrain drains per
// run. The figure in the README uses 100,000:
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
// and ack, batch 100, prefetch 500, no database), then through idemrabbitmq
// into PostgreSQL (claim plus a one-row business write per message, batch
// 100, prefetch 500) with 1 and 4 workers, and with the claim alone (no
// business write) to separate the adapter's cost from the handler's round
// trips. Publishing is not timed.
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
	for _, v := range []struct {
		name    string
		workers int
		write   bool
	}{{"idem", 1, true}, {"idem", 4, true}, {"idem-batch-write", 1, true}, {"idem-batch-write", 2, true}, {"idem-claim-only", 1, false}} {
		workers := v.workers
		b.Run(fmt.Sprintf("%s/workers=%d", v.name, workers), func(b *testing.B) {
			for range b.N {
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
				b.ResetTimer()
				start := time.Now()
				stop := run(b, c)
				select {
				case <-acks.done:
				case <-time.After(10 * time.Minute):
					b.Fatal("drain did not finish in 10 minutes")
				}
				elapsed := time.Since(start)
				b.StopTimer()
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				if rows, _ := d.effects(b); v.write && rows != n {
					b.Fatalf("effects %d, want %d", rows, n)
				}
				rate := float64(n) / elapsed.Seconds()
				b.ReportMetric(rate, "msgs/s")
				if rawRate > 0 {
					b.ReportMetric(rate/rawRate, "x_raw")
				}
			}
		})
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

func (c *countAcks) Settled(_ string, v idemrabbitmq.Verb, _ idem.Result) {
	if v == idemrabbitmq.Ack && c.acked.Add(1) == c.want {
		close(c.done)
	}
}
