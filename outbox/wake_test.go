package outbox

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/sqlinbox"
)

// hourly is a relay configuration under which nothing but a wake-up makes
// the relay look at the table again: polling and lease renewal come once
// an hour.
var hourly = RelayConfig{PollInterval: time.Hour, LeaseTerm: 3 * time.Hour}

// waitHolding waits until the relay holds its shards and has made its
// first pass, so that the next row can only be found after a wake-up.
func waitHolding(t *testing.T, o *core, pub *testPublisher) {
	t.Helper()
	// A first row, published by the relay's first pass, proves the pass
	// happened.
	eventually(t, "the relay's first pass", func() bool { return pub.callCount() >= 1 })
}

// NOTIFY wakes a relay long before its poll interval: with an hour between
// polls, a row committed after the relay went idle is published.
func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	cfg := &Config{Table: "notify_outbox"} // a channel of its own among the parallel tests
	check := func(t *testing.T, c *core, enqueue func(...Message) []string) {
		log := newLog()
		pub := &testPublisher{name: "a", log: log}
		first := enqueue(Message{Destination: "events", Key: "k", Body: []byte("1")})
		c2 := hourly
		r, err := newTestRelay(c, pub, &c2)
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, r)
		waitHolding(t, c, pub)
		eventually(t, "the first row", func() bool { return log.count() == 1 })
		second := enqueue(Message{Destination: "events", Key: "k", Body: []byte("2")})
		eventually(t, "the row committed while the relay was idle", func() bool { return log.count() == 2 })
		if got := log.ids(); !slices.Equal(got, append(first, second...)) {
			t.Fatalf("published %v", got)
		}
	}
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		o, pool := pgxOutbox(t, cfg)
		check(t, o.core, func(m ...Message) []string { return enqueuePgx(t, o, pool, false, m...) })
	})
	t.Run("sql", func(t *testing.T) {
		t.Parallel()
		o, db := sqlOutbox(t, sqlinbox.Postgres, cfg)
		check(t, o.core, func(m ...Message) []string { return enqueueSQL(t, o, db, false, m...) })
	})
	// SQLite has no NOTIFY: Enqueue wakes the relays of the same Outbox
	// value, whose next read waits for the enqueuing transaction to end.
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		o, db := sqlOutbox(t, sqlinbox.SQLite, cfg)
		check(t, o.core, func(m ...Message) []string { return enqueueSQL(t, o, db, false, m...) })
	})
}

// A relay on a table that was never migrated refuses to start, saying so.
func TestRelayRefusesMissingTable(t *testing.T) {
	t.Parallel()
	for _, d := range []sqlinbox.Dialect{sqlinbox.Postgres, sqlinbox.SQLite} {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			o, db := sqlOutbox(t, d, &Config{Table: "migrated"})
			bare, err := NewSQL(db, d, &Config{Table: "never_migrated"})
			if err != nil {
				t.Fatal(err)
			}
			_ = o
			r, err := NewRelay(bare, &testPublisher{log: newLog()}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = r.Run(ctx)
			if err == nil || ctx.Err() != nil {
				t.Fatalf("Run on a missing table: %v (context %v), want a refusal", err, ctx.Err())
			}
			if want := "never_migrated"; !contains(err.Error(), want) {
				t.Fatalf("error %q does not name the table", err)
			}
		})
	}
}
