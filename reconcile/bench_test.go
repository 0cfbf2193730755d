package reconcile_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/reconcile"
)

// BenchmarkJudge compares, on one inbox of 10,000 markers, the three ways
// of judging 1,000 candidates: Predict per ID (a transaction each),
// PredictBatch (one lookup; what Check uses), and the baseline a tool
// restating the rules would write, a plain SELECT of the markers. ns/op is
// per 1,000 IDs; ns/id is per ID.
func BenchmarkJudge(b *testing.B) {
	ctx := context.Background()
	d := newDB(b)
	proc := d.processor(b, idem.ByMessageID)
	const markers, page = 10000, 1000
	if _, err := d.pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256)
SELECT 'billing', 'm-' || g * 2, 'm-' || g * 2, '\x00' FROM generate_series(1, $1) AS g`, markers); err != nil {
		b.Fatal(err)
	}
	msgs := make([]idem.Message, page)
	keys := make([]string, page)
	now := time.Now()
	for i := range msgs {
		// Every other candidate is missing: the markers are the even ones.
		keys[i] = fmt.Sprintf("m-%d", i+1)
		msgs[i] = idem.Message{ID: keys[i], Time: now, TimeSource: idem.TimeFromHeader}
	}
	b.Run("predict-per-id", func(b *testing.B) {
		for b.Loop() {
			for _, m := range msgs {
				if _, err := proc.Predict(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*page), "ns/id")
	})
	b.Run("predict-batch", func(b *testing.B) {
		for b.Loop() {
			if _, err := proc.PredictBatch(ctx, msgs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*page), "ns/id")
	})
	b.Run("check-id-file", func(b *testing.B) {
		file := strings.Join(keys, "\n")
		for b.Loop() {
			if _, err := reconcile.Check(ctx, &reconcile.IDFile{Path: "ids", R: strings.NewReader(file)}, proc, reconcile.Range{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*page), "ns/id")
	})
	b.Run("select-baseline", func(b *testing.B) {
		for b.Loop() {
			rows, err := d.pool.Query(ctx, `SELECT key, message_id FROM idem_inbox WHERE consumer = $1 AND key = ANY($2)`, "billing", keys)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for rows.Next() {
				n++
			}
			if rows.Close(); rows.Err() != nil || n != page/2 {
				b.Fatalf("%d markers, %v", n, rows.Err())
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*page), "ns/id")
	})
}
