package sqlinbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/inboxdb"
)

// TestConsumerStats writes markers at known times for three consumers on
// both dialects, one of which holds only markers newer than every other's,
// and reads each consumer's oldest marker, age, headroom and count back.
func TestConsumerStats(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := b.open(t)
			store := migrated(t, db, b.dialect, nil)
			empty, err := store.ConsumerStats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(empty.Consumers) != 0 || empty.Window <= 0 || empty.Table != "idem_inbox" {
				t.Fatalf("empty inbox: %+v", empty)
			}
			base := time.Now().UTC().Truncate(time.Second)
			at := func(ago time.Duration) time.Time { return base.Add(-ago) }
			arg := func(t time.Time) any {
				if b.name == "sqlite" {
					return t.Format(inboxdb.SQLiteTimeFormat)
				}
				return t
			}
			q := `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until) VALUES ($1, $2, $2, $3, $4, $4)`
			if b.name == "sqlite" {
				q = `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until) VALUES (?1, ?2, ?2, ?3, ?4, ?4)`
			}
			for _, m := range []struct {
				consumer, key string
				t             time.Time
			}{
				{"ledger", "l-1", at(10 * 24 * time.Hour)},
				{"ledger", "l-2", at(time.Hour)},
				{"invoices", "i-1", at(3 * 24 * time.Hour)},
				{"invoices", "i-2", at(5 * time.Minute)},
				{"invoices", "i-3", at(4 * time.Minute)},
				{"stats", "s-1", at(2 * time.Minute)},
			} {
				if _, err := db.ExecContext(ctx, q, m.consumer, m.key, []byte{0}, arg(m.t)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := store.ConsumerStats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			counts, err := store.ConsumerMarkers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := []struct {
				consumer string
				markers  int64
				oldest   time.Time
			}{
				{"invoices", 3, at(3 * 24 * time.Hour)},
				{"ledger", 2, at(10 * 24 * time.Hour)},
				{"stats", 1, at(2 * time.Minute)},
			}
			if len(got.Consumers) != len(want) || len(counts) != len(want) {
				t.Fatalf("consumers %+v, counts %v; want %d of each", got.Consumers, counts, len(want))
			}
			for i, w := range want {
				c := got.Consumers[i]
				if c.Consumer != w.consumer || !c.Oldest.Equal(w.oldest) || counts[w.consumer] != w.markers {
					t.Errorf("consumer %d: %s, oldest %v, %d markers; want %s, %v, %d",
						i, c.Consumer, c.Oldest, counts[c.Consumer], w.consumer, w.oldest, w.markers)
				}
				if c.OldestAge != got.Now.Sub(w.oldest) || c.Headroom != got.Window-c.OldestAge {
					t.Errorf("%s: age %v, headroom %v, at %v with window %v", c.Consumer, c.OldestAge, c.Headroom, got.Now, got.Window)
				}
			}
		})
	}
}
