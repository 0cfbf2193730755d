package pgxinbox_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
)

// BenchmarkPrune100k prunes 100,000 expired markers of one consumer in the
// default batches, their keys summarised.
func BenchmarkPrune100k(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.Pool(b)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Window: window})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if _, err := pool.Exec(ctx, `TRUNCATE idem_inbox_pruned`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, keep_until)
SELECT 'ledger', 'k-' || i, 'k-' || i, '\x00', now() - interval '40 days' + i * interval '1 ms' FROM generate_series(1, 100000) i`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE idem_inbox`); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := store.Prune(ctx, retention.Options{})
		if err != nil || res.Markers != 100000 {
			b.Fatalf("prune: %+v %v", res, err)
		}
	}
}
