package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/sqlinbox"
)

// A relay stuck on a broker that stopped answering loses its shards when
// its leases expire; the relay that takes them over republishes only the
// rows the stuck one had not marked, and the stuck one, when it comes
// back, marks nothing of the shards it lost and publishes nothing more.
func TestLeaseTakeoverRepublishesOnlyUnmarked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o, pool := pgxOutbox(t, &Config{Shards: 4})
	var all []string
	for i := range 30 {
		all = append(all, enqueuePgx(t, o, pool, false, Message{Destination: "events", Key: fmt.Sprintf("k%d", i%10), Body: []byte("x")})...)
	}
	log := newLog()
	stuck, release := make(chan struct{}), make(chan struct{})
	a := &testPublisher{name: "a", log: log, hold: func(call int) {
		if call == 2 {
			close(stuck)
			<-release // a broker that stopped answering; the context is not looked at
		}
	}}
	cfg := RelayConfig{BatchSize: 10, LeaseTerm: 2 * time.Second, PollInterval: 20 * time.Millisecond}
	cfg.Name = "a"
	ra, err := NewRelay(o, a, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopA := runRelay(t, ra)
	<-stuck
	marked := log.ids() // a's first batch, confirmed and marked
	if len(marked) != 10 || ra.Published() != 10 {
		t.Fatalf("relay a published %d and marked %d before it got stuck, want 10", len(marked), ra.Published())
	}

	b := &testPublisher{name: "b", log: log}
	cfg.Name = "b"
	rb, err := NewRelay(o, b, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, rb)
	eventually(t, "relay b sending the rest", func() bool {
		st, err := o.Stats(ctx)
		return err == nil && st.Unsent == 0
	})
	close(release)
	stopA()

	var byB []string
	log.mu.Lock()
	for id, by := range log.by {
		if by == "b" {
			byB = append(byB, id)
		}
	}
	dups := slices.Clone(log.dups)
	log.mu.Unlock()
	for _, id := range byB {
		if slices.Contains(marked, id) {
			t.Fatalf("relay b republished %s, which relay a had marked sent", id)
		}
	}
	if len(byB)+len(marked) != len(all) {
		t.Fatalf("a marked %d and b published %d of %d rows", len(marked), len(byB), len(all))
	}
	// The batch a was stuck on reached the broker twice (the downstream
	// inbox skips the copies), and only that batch.
	if len(dups) != 10 {
		t.Fatalf("%d rows published twice, want the 10 of the stuck batch", len(dups))
	}
	if ra.Published() != 10 {
		t.Fatalf("relay a marked %d rows, want only its first 10: it lost its leases while stuck", ra.Published())
	}
	if a.callCount() != 2 {
		t.Fatalf("relay a called Publish %d times, want 2", a.callCount())
	}
	var sent int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE sent_at IS NOT NULL AND attempts = 1`).Scan(&sent); err != nil {
		t.Fatal(err)
	}
	if sent != len(all) {
		t.Fatalf("%d rows marked sent once, want %d", sent, len(all))
	}
}

type hookLog struct {
	mu       sync.Mutex
	refused  int
	parked   []string
	outages  []time.Duration
	sentByTo map[string]int
}

func (h *hookLog) OnPublish(dest string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sentByTo == nil {
		h.sentByTo = map[string]int{}
	}
	h.sentByTo[dest] += n
}

func (h *hookLog) OnRefuse(r Record, err error, parked bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refused++
	if parked {
		h.parked = append(h.parked, r.ID)
	}
}

func (h *hookLog) OnOutage(err error, wait time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.outages = append(h.outages, wait)
}

func (h *hookLog) parkedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.parked)
}

// A record the broker refuses is tried MaxAttempts times, then parked with
// its reason; the others keep flowing, its key's later rows included; an
// operator's retry sends it again.
func TestPoisonRowParkedOthersFlow(t *testing.T) {
	t.Parallel()
	for _, d := range []sqlinbox.Dialect{sqlinbox.Postgres, sqlinbox.SQLite} {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o, db := sqlOutbox(t, d, nil)
			var accept atomic.Bool
			log, hooks := newLog(), &hookLog{}
			pub := &testPublisher{name: "a", log: log, fate: func(r Record) error {
				if string(r.Body) == "poison" && !accept.Load() {
					return Refused(errors.New("NO_ROUTE: unroutable"))
				}
				return nil
			}}
			ids := enqueueSQL(t, o, db, false,
				Message{Destination: "events", Key: "k1", Body: []byte("ok1")},
				Message{Destination: "events", Key: "k1", Body: []byte("poison")},
				Message{Destination: "events", Key: "k1", Body: []byte("ok2")},
				Message{Destination: "events", Key: "k2", Body: []byte("ok3")},
				Message{Destination: "other", Key: "k2", Body: []byte("ok4")},
			)
			poison := ids[1]
			r, err := NewRelay(o, pub, &RelayConfig{MaxAttempts: 3, RetryBackoff: idem.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
				PollInterval: 20 * time.Millisecond, Hooks: []idem.Hook{hooks}})
			if err != nil {
				t.Fatal(err)
			}
			runRelay(t, r)
			eventually(t, "the poison row parked and the others sent", func() bool {
				st, err := o.Stats(ctx)
				return err == nil && st.Parked == 1 && st.Unsent == 0 && hooks.parkedCount() == 1
			})
			if n := pub.attemptsOf(poison); n != 3 {
				t.Fatalf("poison row tried %d times, want MaxAttempts 3", n)
			}
			got := log.ids()
			want := []string{ids[0], ids[2], ids[3], ids[4]}
			for _, id := range want {
				if !slices.Contains(got, id) {
					t.Fatalf("published %v, missing %s", got, id)
				}
			}
			if slices.Index(got, ids[0]) > slices.Index(got, ids[2]) {
				t.Fatalf("key k1 published out of order: %v", got)
			}
			if len(got) != 4 {
				t.Fatalf("published %d records, want 4 (the poison row never confirmed)", len(got))
			}
			parked, err := o.ParkedRows(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(parked) != 1 || parked[0].ID != poison || parked[0].Attempts != 3 || !strings.Contains(parked[0].Reason, "unroutable") {
				t.Fatalf("parked rows %+v, want the poison row with its reason", parked)
			}
			st, err := o.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Destinations) != 2 || st.Destinations[0].Destination != "events" || st.Destinations[0].Parked != 1 || st.Destinations[1].Sent != 1 {
				t.Fatalf("per destination %+v", st.Destinations)
			}

			accept.Store(true)
			n, err := o.Retry(ctx, RetryFilter{Destination: "events"})
			if err != nil || n != 1 {
				t.Fatalf("retry: %d rows, %v; want 1", n, err)
			}
			eventually(t, "the retried row sent", func() bool {
				st, err := o.Stats(ctx)
				return err == nil && st.Parked == 0 && st.Sent == 5
			})
			if n := log.count(); n != 5 {
				t.Fatalf("%d records published after the retry, want 5", n)
			}
		})
	}
}

// With StrictOrder a parked row holds its key's later rows back until it
// is retried; other keys flow.
func TestStrictOrderHoldsKeyBehindParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o, pool := pgxOutbox(t, nil)
	var accept atomic.Bool
	log := newLog()
	pub := &testPublisher{name: "a", log: log, fate: func(r Record) error {
		if string(r.Body) == "poison" && !accept.Load() {
			return Refused(errors.New("message too large"))
		}
		return nil
	}}
	ids := enqueuePgx(t, o, pool, false,
		Message{Destination: "events", Key: "k1", Body: []byte("ok1")},
		Message{Destination: "events", Key: "k1", Body: []byte("poison")},
		Message{Destination: "events", Key: "k1", Body: []byte("ok2")},
	)
	r, err := NewRelay(o, pub, &RelayConfig{MaxAttempts: 2, RetryBackoff: idem.Backoff{Initial: time.Millisecond}, PollInterval: 20 * time.Millisecond, StrictOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	eventually(t, "the poison row parked", func() bool { return r.Parked() == 1 })
	// A later row of another key, once published, shows the relay has read
	// past k1's held row since it was parked.
	sentinel := enqueuePgx(t, o, pool, false, Message{Destination: "events", Key: "k2", Body: []byte("later")})
	eventually(t, "the other key's row sent", func() bool { return slices.Contains(log.ids(), sentinel[0]) })
	if slices.Contains(log.ids(), ids[2]) {
		t.Fatalf("k1's row after the parked one was published despite StrictOrder")
	}
	accept.Store(true)
	if n, err := o.Retry(ctx, RetryFilter{ID: ids[1]}); err != nil || n != 1 {
		t.Fatalf("retry: %d, %v", n, err)
	}
	eventually(t, "k1 flowing again", func() bool { return log.count() == 4 })
	got := log.ids()
	if i, j := slices.Index(got, ids[1]), slices.Index(got, ids[2]); i < 0 || i > j {
		t.Fatalf("published %v: the retried row must precede its key's later row", got)
	}
}

// A broker that cannot be reached is waited out with capped backoff; no
// attempt is counted and nothing is parked however long it lasts.
func TestBrokerOutageBacksOffWithoutCountingAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o, pool := pgxOutbox(t, nil)
	var calls atomic.Int64
	log, hooks := newLog(), &hookLog{}
	pub := &testPublisher{name: "a", log: log,
		hold: func(call int) { calls.Store(int64(call)) },
		fate: func(Record) error {
			if calls.Load() <= 6 {
				return errors.New("dial tcp 127.0.0.1:5672: connect: connection refused")
			}
			return nil
		}}
	ids := enqueuePgx(t, o, pool, false, Message{Destination: "events", Key: "k", Body: []byte("x")})
	r, err := NewRelay(o, pub, &RelayConfig{MaxAttempts: 2, OutageBackoff: idem.Backoff{Initial: time.Millisecond, Max: 4 * time.Millisecond},
		PollInterval: time.Hour, Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	eventually(t, "the row sent once the broker is back", func() bool {
		st, err := o.Stats(ctx)
		return err == nil && st.Sent == 1
	})
	var attempts int
	var parked sql.NullTime
	if err := pool.QueryRow(ctx, `SELECT attempts, parked_at FROM idem_outbox WHERE id = $1`, ids[0]).Scan(&attempts, &parked); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || parked.Valid {
		t.Fatalf("attempts %d, parked %v: an outage must not count toward parking", attempts, parked.Valid)
	}
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	if len(hooks.outages) != 6 {
		t.Fatalf("%d outages reported, want 6", len(hooks.outages))
	}
	for _, w := range hooks.outages {
		if w <= 0 || w > 4*time.Millisecond {
			t.Fatalf("backoff %v outside (0, OutageBackoff.Max]", w)
		}
	}
}

// A database that stops answering mid-run is an outage too: the relay
// waits, and once the database is back every row is sent.
func TestDatabaseOutageWaitedOut(t *testing.T) {
	t.Parallel()
	url, proxy := pgtest.SchemaBehindFault(t)
	o, db := func() (*Outbox[*sql.Tx], *sql.DB) {
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		o, err := NewSQL(db, sqlinbox.Postgres, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		return o, db
	}()
	log, hooks := newLog(), &hookLog{}
	r, err := NewRelay(o, &testPublisher{name: "a", log: log}, &RelayConfig{LeaseTerm: 3 * time.Second, PollInterval: 20 * time.Millisecond,
		OutageBackoff: idem.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}, Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	first := enqueueSQL(t, o, db, false, Message{Destination: "events", Key: "k", Body: []byte("1")})
	runRelay(t, r)
	eventually(t, "the first row sent", func() bool { return log.count() == 1 })
	proxy.Stop()
	eventually(t, "the relay meeting the outage", func() bool {
		hooks.mu.Lock()
		defer hooks.mu.Unlock()
		return len(hooks.outages) > 0
	})
	proxy.Restore()
	// The pool may still hold idle connections the cut killed (the relay
	// meets some of them; its LISTEN session is not among them): the
	// application's transaction on one fails before it reaches the
	// server, and the application retries.
	var second []string
	eventually(t, "the second row enqueued", func() bool {
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false
		}
		ids, err := o.Enqueue(ctx, tx, Message{Destination: "events", Key: "k", Body: []byte("2")})
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			_ = tx.Rollback()
			return false
		}
		second = ids
		return true
	})
	eventually(t, "both rows marked sent", func() bool {
		st, err := o.Stats(context.Background())
		return err == nil && st.Sent == 2 && st.Unsent == 0
	})
	// A row confirmed just before the database went away is republished
	// (its mark was lost with the connection): the same ID, which the
	// downstream inbox skips. First sightings keep the commit order.
	var seen []string
	for _, id := range log.ids() {
		if !slices.Contains(seen, id) {
			seen = append(seen, id)
		}
	}
	if !slices.Equal(seen, append(first, second...)) {
		t.Fatalf("published %v, want %v then %v", log.ids(), first, second)
	}
}

// Stopping a relay mid-publish finishes the batch in flight: what the
// broker confirmed is marked sent, and the shards are given up at once for
// the other relays, not left to expire.
func TestStopFinishesBatchInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o, pool := pgxOutbox(t, nil)
	var msgs []Message
	for i := range 20 {
		msgs = append(msgs, Message{Destination: "events", Key: fmt.Sprintf("k%d", i), Body: []byte("x")})
	}
	enqueuePgx(t, o, pool, false, msgs...)
	inFlight, finish := make(chan struct{}), make(chan struct{})
	log := newLog()
	pub := &testPublisher{name: "a", log: log, hold: func(call int) {
		if call == 1 {
			close(inFlight)
			<-finish
		}
	}}
	r, err := NewRelay(o, pub, &RelayConfig{BatchSize: 50})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx) }()
	<-inFlight
	cancel() // SIGTERM while the broker has the batch
	close(finish)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	st, err := o.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sent != 20 || st.Unsent != 0 || log.count() != 20 {
		t.Fatalf("after stop: %+v, %d published; want the whole batch marked sent", st, log.count())
	}
	var held, relays int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idem_outbox_leases WHERE owner <> '' OR expires_at > now()),
  (SELECT count(*) FROM idem_outbox_relays)`).Scan(&held, &relays); err != nil {
		t.Fatal(err)
	}
	if held != 0 || relays != 0 {
		t.Fatalf("%d leases still held and %d relays announced after stop", held, relays)
	}
}
