package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
)

type pruneCounter struct {
	n int64
}

func (c *pruneCounter) OnPrune(_ string, n int64) { c.n += n }

// TestPrune: on both dialects, markers go when their keep_until (the later
// of their event time, if any, and their write time) is past the window, in bounded batches; a
// replay older than the window is Expired by a guard with the same window,
// and a duplicate inside it is still skipped after the prune.
func TestPrune(t *testing.T) {
	t.Parallel()
	const window = 14 * 24 * time.Hour
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := b.open(t)
			store := migrated(t, db, b.dialect, nil)
			if _, err := db.ExecContext(ctx, `CREATE TABLE effects (key text)`); err != nil {
				t.Fatal(err)
			}
			ph := func(n int) string {
				if b.dialect == sqlinbox.SQLite {
					return fmt.Sprintf("?%d", n)
				}
				return fmt.Sprintf("$%d", n)
			}
			arg := func(tm *time.Time) any {
				if tm == nil {
					return nil
				}
				if b.dialect == sqlinbox.SQLite {
					return tm.UTC().Format("2006-01-02T15:04:05.000000Z")
				}
				return *tm
			}
			// insert writes a marker as a claim at processed would have:
			// keep_until is the later of the write and the event time.
			insert := func(key string, event *time.Time, processed time.Time) {
				keep := processed
				if event != nil && event.After(keep) {
					keep = *event
				}
				_, err := db.ExecContext(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until) VALUES ('ledger', `+
					ph(1)+`, `+ph(1)+`, `+ph(2)+`, `+ph(3)+`, `+ph(4)+`, `+ph(5)+`)`, key, []byte{0}, arg(event), arg(&processed), arg(&keep))
				if err != nil {
					t.Fatal(err)
				}
			}
			now := time.Now()
			old, young := now.Add(-window-time.Hour), now.Add(-window+time.Hour)
			for i := range 5 {
				insert(fmt.Sprintf("gone-%d", i), &old, old)
			}
			insert("gone-untimed", nil, old)
			insert("keep-young", &young, young)
			insert("keep-untimed", nil, young)
			insert("keep-event-young", &young, old)
			insert("keep-written-young", &old, young)

			dry, err := store.Prune(ctx, retention.Options{Window: window, DryRun: true})
			if err != nil || dry.Markers != 6 {
				t.Fatalf("dry run: %+v %v, want 6", dry, err)
			}
			hooks := &pruneCounter{}
			res, err := store.Prune(ctx, retention.Options{Window: window, BatchSize: 4, Hooks: []idem.Hook{hooks}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Markers != 6 || res.Batches != 2 || hooks.n != 6 {
				t.Fatalf("prune: %+v (hooks %d), want 6 markers in 2 batches", res, hooks.n)
			}
			rows, err := db.QueryContext(ctx, `SELECT key FROM idem_inbox ORDER BY key`)
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for rows.Next() {
				var k string
				if err := rows.Scan(&k); err != nil {
					t.Fatal(err)
				}
				left = append(left, k)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if want := []string{"keep-event-young", "keep-untimed", "keep-written-young", "keep-young"}; !slices.Equal(left, want) {
				t.Fatalf("left %v, want %v", left, want)
			}

			st, err := store.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Rows != 4 || st.NoEventTime != 1 || st.Prunable != 0 || st.Headroom <= 0 || st.Headroom > 2*time.Hour {
				t.Fatalf("stats after prune: %+v", st)
			}

			p, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
				Consumer: "ledger",
				Key:      idem.ByMessageID,
				Horizon:  idem.Horizon{Window: window},
				Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES (`+ph(1)+`)`, m.ID)
					return err
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			// The pruned messages come back (a replay): expired, not applied.
			if r := p.Process(ctx, idem.Message{ID: "gone-0", Time: old}); r.Outcome != idem.Expired {
				t.Fatalf("replay of a pruned message: %v %v, want Expired", r.Outcome, r.Err)
			}
			// The kept ones are still duplicates.
			if r := p.Process(ctx, idem.Message{ID: "keep-event-young", Time: young}); r.Outcome != idem.Duplicate {
				t.Fatalf("redelivery inside the window: %v %v, want Duplicate", r.Outcome, r.Err)
			}
			var effects int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM effects`).Scan(&effects); err != nil || effects != 0 {
				t.Fatalf("effects = %d (%v), want 0", effects, err)
			}
		})
	}
}
