package reconcile_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/pgxinbox"
)

func amqpURL() string {
	if u := os.Getenv("IDEM_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// quiet is the logger of everything under test.
var quiet = slog.New(slog.DiscardHandler)

// db is one test's schema: the inbox, the outbox, and the consumer's effect
// table, without a unique constraint, so that an effect applied twice
// shows.
type db struct {
	url   string
	pool  *pgxpool.Pool
	store *pgxinbox.Store
	ob    *outbox.Outbox[pgx.Tx]
}

func newDB(t testing.TB) *db {
	t.Helper()
	ctx := context.Background()
	d := &db{url: pgtest.Schema(t)}
	pool, err := pgxpool.New(ctx, d.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	d.pool = pool
	if d.store, err = pgxinbox.New(pool, &pgxinbox.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := d.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if d.ob, err = outbox.NewPgx(pool, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return d
}

// processor is the consumer "billing": its effect is a row in effects.
func (d *db) processor(t testing.TB, key idem.KeyFunc, hooks ...idem.Hook) *idem.Processor[pgx.Tx] {
	t.Helper()
	p, err := idem.NewProcessor(d.store, &idem.Config[pgx.Tx]{
		Consumer: "billing",
		Key:      key,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, m.ID)
			return err
		},
		Hooks:  hooks,
		Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// duplicates remembers the message IDs that met their marker.
type duplicates struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (h *duplicates) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	if r.Outcome == idem.Duplicate {
		h.mu.Lock()
		if h.ids == nil {
			h.ids = map[string]bool{}
		}
		h.ids[r.MessageID] = true
		h.mu.Unlock()
	}
}

// all reports whether every one of ids met its marker.
func (h *duplicates) all(ids []string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		if !h.ids[id] {
			return false
		}
	}
	return true
}

// effects counts the effect rows and the distinct messages among them.
func (d *db) effects(t testing.TB) (rows, distinct int) {
	t.Helper()
	if err := d.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// lose deletes the markers and the effects of n random applied messages
// behind the consumer's back, as a failover to a lagging replica loses
// them, and returns their IDs, sorted.
func (d *db) lose(t testing.TB, ids []string, n int) []string {
	t.Helper()
	picked := append([]string(nil), ids...)
	rand.Shuffle(len(picked), func(i, j int) { picked[i], picked[j] = picked[j], picked[i] })
	picked = picked[:n]
	sort.Strings(picked)
	ctx := context.Background()
	tag, err := d.pool.Exec(ctx, `DELETE FROM idem_inbox WHERE consumer = 'billing' AND message_id = ANY($1)`, picked)
	if err != nil || tag.RowsAffected() != int64(n) {
		t.Fatalf("deleting markers: %v, %d deleted, want %d", err, tag.RowsAffected(), n)
	}
	tag, err = d.pool.Exec(ctx, `DELETE FROM effects WHERE message_id = ANY($1)`, picked)
	if err != nil || tag.RowsAffected() != int64(n) {
		t.Fatalf("deleting effects: %v, %d deleted, want %d", err, tag.RowsAffected(), n)
	}
	return picked
}

// waitFor polls until done, failing the test after limit: a guard against
// a stall, not a measure of speed.
func waitFor(t testing.TB, limit time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// queue declares a quorum queue with its dead-letter queue on conn,
// deleted when t ends.
func queue(t testing.TB, conn *amqp.Connection) string {
	t.Helper()
	suffix := make([]byte, 4)
	_, _ = crand.Read(suffix)
	q := "reconcile-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "-" + hex.EncodeToString(suffix)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	top, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, q, nil)
	if err != nil {
		t.Fatalf("declaring %s: %v", q, err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(top.Queue, false, false, false)
		_, _ = ch.QueueDelete(top.DeadLetterQueue, false, false, false)
		_ = ch.ExchangeDelete(top.DeadLetterExchange, false, false)
	})
	return q
}

func dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable (%v); start it with: rabbitmq-server -detached, or set IDEM_AMQP_URL", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// run runs f in the background until t ends, and fails the test if it
// returns an error other than its context's.
func run(t testing.TB, what string, f func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// missingIDs lists the IDs a report finds missing, sorted.
func missingIDs(rep *reconcileReport) []string {
	ids := make([]string, 0, len(rep.Missing))
	for _, f := range rep.Missing {
		ids = append(ids, f.ID)
	}
	sort.Strings(ids)
	return ids
}
