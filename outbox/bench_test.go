package outbox

import (
	"context"
	"fmt"
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
