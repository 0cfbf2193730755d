package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/pooltest"
	"github.com/idemkit/idem/sqlinbox"
)

// Relays on a pool of their own size publish every committed row: the
// LISTEN session of each relay is not one of the pool's connections, and
// every step (Enqueue, lease, read, mark) holds at most one. One relay on a
// pool of one, and four relays in one process on a pool of four (pgx's
// default size on a small machine), through pgx and through database/sql.
func TestRelaysOnAPoolOfTheirSize(t *testing.T) {
	t.Parallel()
	const rows = 12
	check := func(t *testing.T, c *core, relays int, enqueue func(...Message) []string) {
		log := newLog()
		for i := range relays {
			cfg := RelayConfig{LeaseTerm: 3 * time.Second, Name: fmt.Sprintf("r%d", i)}
			r, err := newTestRelay(c, &testPublisher{name: cfg.Name, log: log}, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			runRelay(t, r)
		}
		var want []string
		for i := range rows {
			want = append(want, enqueue(Message{Destination: "events", Key: fmt.Sprintf("k%d", i), Body: []byte("x")})...)
		}
		eventually(t, fmt.Sprintf("%d committed rows published by %d relays", rows, relays), func() bool {
			st, err := c.stats(context.Background())
			return err == nil && st.Sent == rows
		})
		got := map[string]bool{}
		for _, id := range log.ids() {
			got[id] = true
		}
		for _, id := range want {
			if !got[id] {
				t.Fatalf("row %s marked sent but never published", id)
			}
		}
	}
	for _, relays := range []int{1, 4} {
		t.Run(fmt.Sprintf("pgx-%d", relays), func(t *testing.T) {
			t.Parallel()
			pool := pooltest.OpenPgx(t, pgtest.Schema(t), relays)
			o, err := NewPgx(pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := o.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			check(t, o.core, relays, func(m ...Message) []string {
				return enqueuePgx(t, o, pool, false, m...)
			})
		})
		t.Run(fmt.Sprintf("sql-%d", relays), func(t *testing.T) {
			t.Parallel()
			db, err := sql.Open("pgx", pgtest.Schema(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			pooltest.SQL(t, db, relays)
			o, err := NewSQL(db, sqlinbox.Postgres, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := o.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			check(t, o.core, relays, func(m ...Message) []string {
				return enqueueSQL(t, o, db, false, m...)
			})
		})
	}
}
