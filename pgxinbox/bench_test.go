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

// benchMode is one way of writing the business row.
type benchMode struct {
	name    string
	natural bool   // no inbox claim
	table   string // where the row goes
}

var benchModes = []benchMode{
	// claim: the inbox claim plus the write, in one transaction.
	{"claim", false, "ledger"},
	// noclaim: the same write with no claim (a natural consumer: same
	// transaction discipline, no marker). The baseline.
	{"noclaim", true, "ledger"},
	// unique: no inbox, but the business table carries its own unique
	// index on the message ID, the guard a team would add by hand. The
	// claim costs about what any constraint costs.
	{"unique", true, "ledger_unique"},
}

// BenchmarkClaim measures messages per second for claim plus a one-row
// business write, one transaction per message (one worker and eight) and in
// batches, next to the same write without any claim and next to a write
// guarded by its own unique index, in the same run:
//
//	go test -run '^$' -bench Claim -benchtime 3s ./pgxinbox/
func BenchmarkClaim(b *testing.B) {
	pool, store := openLayout(b, pgxinbox.Plain, nil)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (merchant_id int, amount bigint, message_id text);
CREATE TABLE ledger_unique (merchant_id int, amount bigint, message_id text UNIQUE)`); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	next := func() idem.Message {
		return idem.Message{ID: "evt-" + strconv.FormatInt(seq.Add(1), 10), Body: []byte(`{"merchant_id":1,"amount":12500}`)}
	}
	for _, mode := range benchModes {
		// One transaction per message from 8 concurrent workers, as a
		// consumer with several partitions or channels runs.
		b.Run(mode.name+"/batch=1/workers=8", func(b *testing.B) {
			p := benchProcessor(b, store, "bench-par-"+mode.name, mode)
			b.SetParallelism(4) // GOMAXPROCS is 2: 8 workers
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if r := p.Process(ctx, next()); r.Outcome != idem.Applied {
						b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
					}
					n.Add(1)
				}
			})
			b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "msgs/s")
		})
	}
	for _, batch := range []int{1, 10, 100, 500} {
		for _, mode := range benchModes {
			b.Run(fmt.Sprintf("%s/batch=%d", mode.name, batch), func(b *testing.B) {
				p := benchProcessor(b, store, fmt.Sprintf("bench-%s-%d", mode.name, batch), mode)
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

// benchProcessor writes one row per message into mode's table, with one
// statement per transaction, as a throughput-minded consumer would.
func benchProcessor(b *testing.B, store *pgxinbox.Store, consumer string, mode benchMode) *idem.Processor[pgx.Tx] {
	insert := `INSERT INTO ` + mode.table + ` SELECT 1, 12500, id FROM unnest($1::text[]) AS id`
	if mode.table == "ledger_unique" {
		insert += ` ON CONFLICT (message_id) DO NOTHING`
	}
	cfg := &idem.Config[pgx.Tx]{
		Consumer: consumer,
		Natural:  mode.natural,
		HandleBatch: func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.ID
			}
			_, err := tx.Exec(ctx, insert, ids)
			return err
		},
	}
	if !mode.natural {
		cfg.Key = idem.ByMessageID
	}
	p, err := idem.NewProcessor(store, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return p
}
