package pgxinbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/pgxinbox"
)

// BenchmarkClaim measures messages per second for claim plus a one-row
// business write, one transaction per message and in batches, next to the
// same write without any claim (a natural consumer: same transaction
// discipline, no marker) in the same run. Compare the msgs/s metric of
// claim/N with noclaim/N:
//
//	go test -run '^$' -bench Claim -benchtime 3s ./pgxinbox/
func BenchmarkClaim(b *testing.B) {
	pool, store := openLayout(b, pgxinbox.Plain, nil)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (merchant_id int, amount bigint, message_id text)`); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	for _, batch := range []int{1, 10, 100, 500} {
		for _, natural := range []bool{false, true} {
			if batch != 1 {
				break
			}
			// One transaction per message from 8 concurrent workers, as a
			// consumer with several partitions or channels runs.
			name := map[bool]string{false: "claim", true: "noclaim"}[natural]
			b.Run(name+"/batch=1/workers=8", func(b *testing.B) {
				p := benchProcessor(b, store, "bench-par-"+name, natural)
				b.SetParallelism(4) // GOMAXPROCS is 2: 8 workers
				var n atomic.Int64
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						m := idem.Message{ID: "evt-" + strconv.FormatInt(seq.Add(1), 10), Body: []byte(`{"merchant_id":1,"amount":12500}`)}
						if r := p.Process(ctx, m); r.Outcome != idem.Applied {
							b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
						}
						n.Add(1)
					}
				})
				b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "msgs/s")
			})
		}
		for _, natural := range []bool{false, true} {
			name := "claim"
			if natural {
				name = "noclaim"
			}
			b.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(b *testing.B) {
				p := benchProcessor(b, store, fmt.Sprintf("bench-%s-%d", name, batch), natural)
				msgs := make([]idem.Message, batch)
				b.ResetTimer()
				n := 0
				for b.Loop() {
					for i := range msgs {
						msgs[i] = idem.Message{ID: "evt-" + strconv.FormatInt(seq.Add(1), 10), Body: []byte(`{"merchant_id":1,"amount":12500}`)}
					}
					var rs []idem.Result
					if batch == 1 {
						rs = []idem.Result{p.Process(ctx, msgs[0])}
					} else {
						rs = p.ProcessBatch(ctx, msgs)
					}
					for _, r := range rs {
						if r.Outcome != idem.Applied {
							b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
						}
					}
					n += batch
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}

// benchProcessor writes one ledger row per message, with one statement per
// transaction, as a throughput-minded consumer would.
func benchProcessor(b *testing.B, store *pgxinbox.Store, consumer string, natural bool) *idem.Processor[pgx.Tx] {
	cfg := &idem.Config[pgx.Tx]{
		Consumer: consumer,
		Natural:  natural,
		HandleBatch: func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.ID
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger SELECT 1, 12500, id FROM unnest($1::text[]) AS id`, ids)
			return err
		},
	}
	if !natural {
		cfg.Key = idem.ByMessageID
	}
	p, err := idem.NewProcessor(store, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return p
}
