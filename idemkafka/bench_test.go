package idemkafka_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkPipeline consumes records spread over 6 partitions into
// PostgreSQL, one business row per record, with the inbox claim ("claim")
// and without it ("natural", the same pipeline writing no marker), in the
// same run, and reports msgs/s. IDEM_BENCH_RECORDS sets the number of
// records (default 20000; the README figure uses 200000):
//
//	IDEM_BENCH_RECORDS=200000 go test -run '^$' -bench Pipeline -benchtime 1x ./idemkafka/
func BenchmarkPipeline(b *testing.B) {
	n := 20000
	if s := os.Getenv("IDEM_BENCH_RECORDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 6 {
			b.Fatalf("IDEM_BENCH_RECORDS=%q: want a number of records ≥ 6", s)
		}
		n = v
	}
	const parts = 6
	k := newKafka(b)
	topic := k.topic(b, "bench", parts)
	produce(b, k.client(b), topic, parts, 0, n, msgID)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	rates := map[string]float64{}
	for _, natural := range []bool{false, true} {
		name := "claim"
		if natural {
			name = "natural"
		}
		b.Run(name, func(b *testing.B) {
			d := newDB(b)
			proc := d.processor(b, nil, nil, func(c *idem.Config[pgx.Tx]) {
				c.Logger = quiet
				if natural {
					c.Key, c.Natural = nil, true
				}
			})
			var elapsed time.Duration
			for i := range b.N {
				obs := newCommits(b, ends(n, parts))
				// The clock starts when the group assigned the partitions:
				// joining is not part of the pipeline's rate.
				var start atomic.Pointer[time.Time]
				assigned := kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
					now := time.Now()
					start.CompareAndSwap(nil, &now)
				})
				c, err := idemkafka.NewConsumer(k.groupClient(b, k.group(name+strconv.Itoa(i)), []string{topic}, assigned), proc,
					&idemkafka.Config{Hooks: obs, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				stop := run(b, c)
				wait(b, obs.done, 10*time.Minute, "every partition committed")
				elapsed += time.Since(*start.Load())
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				if rows, distinct := d.effects(b); rows != n || distinct != n {
					b.Fatalf("effects: %d rows, %d distinct; want %d", rows, distinct, n)
				}
				if _, err := d.pool.Exec(context.Background(), `TRUNCATE effects, idem_inbox`); err != nil {
					b.Fatal(err)
				}
			}
			rate := float64(n*b.N) / elapsed.Seconds()
			rates[name] = rate
			b.ReportMetric(rate, "msgs/s")
			b.ReportMetric(0, "ns/op")
		})
	}
	if rates["claim"] > 0 && rates["natural"] > 0 {
		b.Logf("%d records over %d partitions: claim %.0f msgs/s, natural %.0f msgs/s, the claim costs %.1f%%",
			n, parts, rates["claim"], rates["natural"], 100*(1-rates["claim"]/rates["natural"]))
	}
}
