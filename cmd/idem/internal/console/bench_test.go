package console

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/dlq"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// BenchmarkConsumers is the inbox part of the overview, which scans the
// inbox table three times (the figures, per hour, per day), against one
// count(*) of the same table in the same run: what a page costs on an inbox
// of 100,000 markers, as a ratio to the cheapest full scan.
func BenchmarkConsumers(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.Pool(b)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until)
SELECT 'consumer-' || (i % 4), 'k-' || i, 'k-' || i, sha256(i::text::bytea),
       CASE WHEN i % 9 = 0 THEN NULL ELSE now() - (i % 300) * interval '1 hour' END,
       now() - (i % 300) * interval '1 hour', now() + interval '14 days'
FROM generate_series(1, 100000) AS i`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE idem_inbox`); err != nil {
		b.Fatal(err)
	}
	in, err := dlq.NewInbox(pool, &dlq.InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{Inbox: in, DB: pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	var base, page time.Duration
	b.Run("count", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			var n int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil || n != 100000 {
				b.Fatal(n, err)
			}
		}
		base = time.Since(start) / time.Duration(b.N)
	})
	b.Run("consumers", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			in, err := s.Consumers(ctx)
			if err != nil || len(in.Consumers) != 4 || in.Consumers[0].Markers != 25000 {
				b.Fatal(in, err)
			}
		}
		page = time.Since(start) / time.Duration(b.N)
	})
	if base > 0 && page > 0 {
		b.Logf("the consumers' figures cost %.1f× a count(*) of the table (%v against %v)", float64(page)/float64(base), page, base)
	}
}
