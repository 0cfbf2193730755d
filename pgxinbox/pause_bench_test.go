package pgxinbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/pgxinbox"
)

// unpausable is a store without pauses: the processor over it never reads
// one.
type unpausable struct{ idemstore.Store[pgx.Tx] }

// BenchmarkPauseCheck measures what reading the consumer's pause (at most
// once per idem.PauseTTL, an atomic load otherwise) costs a batch: the
// same consumer over the same store, with and without pauses, in the same
// run:
//
//	go test -run '^$' -bench PauseCheck -benchtime 5s ./pgxinbox/
func BenchmarkPauseCheck(b *testing.B) {
	pool, store := openLayout(b, pgxinbox.Plain, nil)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (merchant_id int, amount bigint, message_id text)`); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	next := func() idem.Message {
		return idem.Message{ID: "evt-" + strconv.FormatInt(seq.Add(1), 10), Body: []byte(`{"merchant_id":1,"amount":12500}`)}
	}
	for _, batch := range []int{1, 10, 100} {
		for _, mode := range []string{"pause-check", "no-pause-check"} {
			b.Run(fmt.Sprintf("%s/batch=%d", mode, batch), func(b *testing.B) {
				var s idemstore.Store[pgx.Tx] = store
				if mode == "no-pause-check" {
					s = unpausable{store}
				}
				p, err := idem.NewProcessor(s, &idem.Config[pgx.Tx]{
					Consumer: fmt.Sprintf("bench-%s-%d", mode, batch), Key: idem.ByMessageID,
					HandleBatch: func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
						ids := make([]string, len(msgs))
						for i, m := range msgs {
							ids[i] = m.ID
						}
						_, err := tx.Exec(ctx, `INSERT INTO ledger SELECT 1, 12500, id FROM unnest($1::text[]) AS id`, ids)
						return err
					},
				})
				if err != nil {
					b.Fatal(err)
				}
				msgs := make([]idem.Message, batch)
				n := 0
				for b.Loop() {
					for i := range msgs {
						msgs[i] = next()
					}
					for _, r := range p.ProcessBatch(ctx, msgs) {
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
