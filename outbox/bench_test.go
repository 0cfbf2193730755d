package outbox

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/sqlinbox"
)

// BenchmarkRelay measures how fast one relay drains committed rows (read,
// publish, mark) when the broker costs nothing: the outbox's own database
// cost per row. Rows are enqueued before the timer starts, 100 per
// transaction over 100 keys.
//
//	go test -run '^$' -bench BenchmarkRelay -benchtime 20000x ./outbox/
func BenchmarkRelay(b *testing.B) {
	for _, d := range []sqlinbox.Dialect{sqlinbox.Postgres, sqlinbox.SQLite} {
		b.Run(d.Name(), func(b *testing.B) {
			ctx := context.Background()
			o, db := sqlOutbox(b, d, nil)
			for i := 0; i < b.N; i += 100 {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				msgs := make([]Message, 0, 100)
				for j := i; j < min(i+100, b.N); j++ {
					msgs = append(msgs, Message{Destination: "events", Key: fmt.Sprintf("k%d", j%100), Body: []byte(`{"n":1}`)})
				}
				if _, err := o.Enqueue(ctx, tx, msgs...); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			r, err := NewRelay(o, &testPublisher{name: "bench", log: newLog()}, &RelayConfig{PollInterval: 10 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			ran := make(chan error, 1)
			b.ResetTimer()
			go func() { ran <- r.Run(rctx) }()
			for r.Published() < int64(b.N) {
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			cancel()
			if err := <-ran; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkRelayLatency measures the time from an enqueuing commit to the
// publisher holding the record, one row at a time, on PostgreSQL: woken by
// NOTIFY (polling once an hour), and by polling every 100 ms alone (as
// through a lone *pgx.Conn, which cannot LISTEN). Each row is committed
// just after the relay's previous pass, polling's worst case.
//
//	go test -run '^$' -bench BenchmarkRelayLatency -benchtime 200x ./outbox/
func BenchmarkRelayLatency(b *testing.B) {
	for _, mode := range []string{"notify", "poll-100ms"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			o, db := sqlOutbox(b, sqlinbox.Postgres, nil)
			cfg := &RelayConfig{PollInterval: time.Hour, LeaseTerm: 3 * time.Hour}
			if mode != "notify" {
				o.listen = nil
				cfg.PollInterval = 100 * time.Millisecond
			}
			got := make(chan string, 1)
			pub := &testPublisher{name: "bench", log: newLog(), fate: func(r Record) error {
				got <- r.ID
				return nil
			}}
			r, err := NewRelay(o, pub, cfg)
			if err != nil {
				b.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- r.Run(rctx) }()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				ids, err := o.Enqueue(ctx, tx, Message{Destination: "events", Key: "k", Body: []byte("x")})
				if err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				for id := range got {
					if id == ids[0] {
						break
					}
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			cancel()
			if err := <-ran; err != nil {
				b.Fatal(err)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
		})
	}
}
