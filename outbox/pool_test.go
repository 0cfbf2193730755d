package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/pooltest"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
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

// Every operation of the outbox works on a pool of one connection:
// Migrate (new and again), Enqueue, a relay that publishes and parks,
// Stats, ParkedRows, Retry and Prune; none asks the pool for a second
// connection while it holds one (internal/pooltest stops the binary if
// one waits).
func TestOperationsOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, o interface {
		Migrate(context.Context) (MigrateReport, error)
		Stats(context.Context) (Stats, error)
		ParkedRows(context.Context, int) ([]ParkedRow, error)
		Retry(context.Context, RetryFilter) (int64, error)
		Prune(context.Context, PruneOptions) (int64, error)
	}, c *core, enqueue func(...Message) []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for range 2 {
			if _, err := o.Migrate(ctx); err != nil {
				t.Fatalf("migrating: %v", err)
			}
		}
		pub := &testPublisher{name: "a", log: newLog(), fate: func(r Record) error {
			if r.Key == "bad" {
				return Refused(errors.New("no such exchange"))
			}
			return nil
		}}
		r, err := newTestRelay(c, pub, &RelayConfig{MaxAttempts: 1, LeaseTerm: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, r)
		enqueue(Message{Destination: "events", Key: "k1", Body: []byte("1")}, Message{Destination: "events", Key: "k2", Body: []byte("2")})
		enqueue(Message{Destination: "events", Key: "bad", Body: []byte("3")})
		eventually(t, "two rows sent and one parked", func() bool {
			st, err := o.Stats(ctx)
			return err == nil && st.Sent == 2 && st.Parked == 1
		})
		parked, err := o.ParkedRows(ctx, 10)
		if err != nil || len(parked) != 1 {
			t.Fatalf("parked rows: %v, %v; want one", parked, err)
		}
		if n, err := o.Retry(ctx, RetryFilter{Key: "bad"}); err != nil || n != 1 {
			t.Fatalf("retry: %d, %v; want 1", n, err)
		}
		eventually(t, "the retried row parked again", func() bool { return pub.attemptsOf(parked[0].ID) >= 2 && r.Parked() >= 2 })
		for _, dry := range []bool{true, false} {
			if _, err := o.Prune(ctx, PruneOptions{DryRun: dry}); err != nil {
				t.Fatalf("prune (dry run %v): %v", dry, err)
			}
		}
	}
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		pool := pooltest.OpenPgx(t, pgtest.Schema(t), 1)
		o, err := NewPgx(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(t, o, o.core, func(m ...Message) []string { return enqueuePgx(t, o, pool, false, m...) })
	})
	for _, d := range []sqlinbox.Dialect{sqlinbox.Postgres, sqlinbox.SQLite} {
		t.Run("sql-"+d.Name(), func(t *testing.T) {
			t.Parallel()
			var db *sql.DB
			var err error
			if d == sqlinbox.SQLite {
				db, err = sqliteinbox.Open(filepath.Join(t.TempDir(), "outbox.db"))
			} else {
				db, err = sql.Open("pgx", pgtest.Schema(t))
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			pooltest.SQL(t, db, 1)
			o, err := NewSQL(db, d, nil)
			if err != nil {
				t.Fatal(err)
			}
			check(t, o, o.core, func(m ...Message) []string { return enqueueSQL(t, o, db, false, m...) })
		})
	}
}
