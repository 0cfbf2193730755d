package idemnats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/natstest"
)

// publishAsync publishes n messages with IDs to stream, waiting for every
// PubAck.
func publishAsync(b *testing.B, js jetstream.JetStream, stream string, n int) {
	b.Helper()
	for i := 0; i < n; {
		var fs []jetstream.PubAckFuture
		for ; i < n && len(fs) < 1000; i++ {
			id := fmt.Sprintf("b-%07d", i)
			f, err := js.PublishAsync(stream+".msgs", []byte("body of "+id), jetstream.WithMsgID(id))
			if err != nil {
				b.Fatal(err)
			}
			fs = append(fs, f)
		}
		for _, f := range fs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			case <-time.After(30 * time.Second):
				b.Fatal("no PubAck within 30s")
			}
		}
	}
}

// BenchmarkConsume measures messages per second through one consumer, all
// published beforehand: a plain JetStream consumer that fetches batches of
// 100 and acks each message (no database); the same writing one effect
// row per message in one transaction per batch, with no inbox (no
// exactly-once); and idemnats with batches of 100 writing the same rows
// through the PostgreSQL inbox. Run with -benchtime=5000x or so: b.N is the number of
// messages.
func BenchmarkConsume(b *testing.B) {
	srv := natstest.Start(b)
	_, js := connect(b, srv.URL())
	b.Run("plain-ack", func(b *testing.B) {
		stream := uniqueName(b)
		createStreams(b, js, stream)
		publishAsync(b, js, stream, b.N)
		ctx := context.Background()
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "plain", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for n := 0; n < b.N; {
			batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			for m := range batch.Messages() {
				if err := m.Ack(); err != nil {
					b.Fatal(err)
				}
				n++
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("plain-sql-batch100", func(b *testing.B) {
		stream := uniqueName(b)
		createStreams(b, js, stream)
		d := newDB(b)
		publishAsync(b, js, stream, b.N)
		ctx := context.Background()
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "plain", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for n := 0; n < b.N; {
			batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			var ms []jetstream.Msg
			for m := range batch.Messages() {
				ms = append(ms, m)
			}
			tx, err := d.pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, m := range ms {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (key, attempt) VALUES ($1, 1)`, m.Headers().Get(jetstream.MsgIDHeader)); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			for _, m := range ms {
				if err := m.Ack(); err != nil {
					b.Fatal(err)
				}
				n++
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("idemnats-batch100", func(b *testing.B) {
		stream := uniqueName(b)
		createStreams(b, js, stream)
		d := newDB(b)
		publishAsync(b, js, stream, b.N)
		c, err := idemnats.NewConsumer(d.processor(b), &idemnats.Config{URL: srv.URL(), Stream: stream, Logger: quiet, FetchWait: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		stop := running(b, c)
		for c.Stats().Applied < uint64(b.N) {
			time.Sleep(5 * time.Millisecond)
		}
		b.StopTimer()
		_ = stop()
		if rows, distinct := d.effects(b); rows != b.N || distinct != b.N {
			b.Fatalf("%d effects of %d messages; want %d, one each", rows, distinct, b.N)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
