package idemprom_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"
)

const amqpURL = "amqp://guest:guest@127.0.0.1:5672/"

// pgxOutbox is a migrated outbox on pool.
func pgxOutbox(t *testing.T, pool *pgxpool.Pool) *outbox.Outbox[pgx.Tx] {
	t.Helper()
	ob, err := outbox.NewPgx(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ob
}

// enqueue commits msgs in one transaction of pool and returns their IDs.
func enqueue(t *testing.T, ob *outbox.Outbox[pgx.Tx], pool *pgxpool.Pool, msgs ...outbox.Message) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ids, err := ob.Enqueue(ctx, tx, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// eventually waits for cond, failing with what after a generous minute: a
// liveness bound for a loaded machine, not a speed assertion.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// uniqueName is a RabbitMQ name no other test uses.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// exchangeWithQueue declares a durable direct exchange bound to a durable
// queue by the queue's name, both deleted when the test ends.
func exchangeWithQueue(t *testing.T, conn *amqp.Connection) (exchange, queue string) {
	t.Helper()
	exchange, queue = uniqueName("idemprom-outbox"), uniqueName("idemprom-outbox-q")
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, queue, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL)
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
		}
	})
	return exchange, queue
}

// queued counts the messages in queue.
func queued(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic})
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// runRelay runs r until the test ends and fails the test when Run returns
// an error.
func runRelay(t *testing.T, r *outbox.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
	})
}

// TestOutboxMetrics runs a relay from a real outbox to RabbitMQ with
// Metrics as its hook and an OutboxCollector on the table: records to an
// exchange that exists are published and counted, records to one that
// does not are refused until parked, a broker that goes away is counted
// as an outage, and the collector's gauges follow the rows through it all
// — unsent, the oldest unsent row's age, parked, sent — until an operator
// creates the exchange and retries the parked rows.
func TestOutboxMetrics(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	ob := pgxOutbox(t, pool)

	direct, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable on %s: %v", amqpURL, err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	exchange, queue := exchangeWithQueue(t, direct)
	missing := uniqueName("idemprom-outbox-missing")

	u, err := neturl.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	broker := netfault.New(t, u.Host)
	redial := func(ctx context.Context) (*amqp.Connection, error) {
		return amqp.DialConfig(broker.URL(t, amqpURL), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second), Heartbeat: time.Second})
	}
	conn, err := redial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	pub, err := amqppub.New(conn, &amqppub.Config{Redial: redial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	coll := idemprom.NewOutboxCollector(ob, "", &idemprom.OutboxOptions{Interval: -1})
	reg.MustRegister(coll)
	dest := func(d string) map[string]string { return map[string]string{"table": "idem_outbox", "destination": d} }
	gauge := func(name, d string) float64 {
		t.Helper()
		v, ok := value(t, reg, name, dest(d))
		if !ok {
			t.Fatalf("no series %s{destination=%q} (collector error: %v)", name, d, coll.Err())
		}
		return v
	}
	counter := func(name, d string) float64 {
		t.Helper()
		v, _ := value(t, reg, name, map[string]string{"destination": d})
		return v
	}

	const published, refused = 5, 2
	var msgs []outbox.Message
	for i := range published {
		msgs = append(msgs, outbox.Message{Destination: exchange, RoutingKey: queue, Key: fmt.Sprintf("order-%d", i), Body: []byte(fmt.Sprint(i))})
	}
	for i := range refused {
		msgs = append(msgs, outbox.Message{Destination: missing, RoutingKey: queue, Key: fmt.Sprintf("lost-%d", i), Body: []byte("lost")})
	}
	ids := enqueue(t, ob, pool, msgs...)
	// The first row waited an hour, as behind a relay that was down.
	if _, err := pool.Exec(ctx, `UPDATE idem_outbox SET enqueued_at = now() - interval '1 hour' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}

	// Before any relay ran.
	if up, _ := value(t, reg, "idem_outbox_stats_up", map[string]string{"table": "idem_outbox"}); up != 1 {
		t.Fatalf("idem_outbox_stats_up = %v (%v)", up, coll.Err())
	}
	if n := gauge("idem_outbox_unsent", exchange); n != published {
		t.Errorf("unsent to %s: %v, want %d", exchange, n, published)
	}
	if n := gauge("idem_outbox_unsent", missing); n != refused {
		t.Errorf("unsent to %s: %v, want %d", missing, n, refused)
	}
	if age := gauge("idem_outbox_oldest_unsent_age_seconds", exchange); age < time.Hour.Seconds() || age >= 2*time.Hour.Seconds() {
		t.Errorf("oldest unsent to %s: %v s, want the hour it waited", exchange, age)
	}
	if age := gauge("idem_outbox_oldest_unsent_age_seconds", missing); age <= 0 || age >= time.Hour.Seconds() {
		t.Errorf("oldest unsent to %s: %v s, want above zero and under the hour of the other destination", missing, age)
	}
	if n := gauge("idem_outbox_parked", missing); n != 0 {
		t.Errorf("parked before any relay: %v", n)
	}

	const maxAttempts = 2
	relay, err := outbox.NewRelay(ob, pub, &outbox.RelayConfig{
		Hooks: []idem.Hook{m}, MaxAttempts: maxAttempts, RetryBackoff: idem.Backoff{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond},
		PollInterval: 50 * time.Millisecond, PublishTimeout: 3 * time.Second,
		OutageBackoff: idem.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:        slog.New(slog.DiscardHandler), // the refusals and the outage are caused on purpose
	})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay)
	eventually(t, "every record published or parked", func() bool {
		return counter("idem_outbox_published_total", exchange) == published && counter("idem_outbox_parked_total", missing) == refused
	})
	if n := counter("idem_outbox_refused_total", missing); n != refused*maxAttempts {
		t.Errorf("idem_outbox_refused_total{destination=%s} = %v, want %d records × %d attempts", missing, n, refused, maxAttempts)
	}
	if n := counter("idem_outbox_refused_total", exchange); n != 0 {
		t.Errorf("refusals counted for the exchange that exists: %v", n)
	}
	if relay.Published() != published || relay.Parked() != refused {
		t.Errorf("the relay says %d published, %d parked; the counters %d and %d", relay.Published(), relay.Parked(), published, refused)
	}
	if n := queued(t, direct, queue); n != published {
		t.Errorf("%d messages in the queue, want %d", n, published)
	}
	for name, want := range map[string]float64{"idem_outbox_unsent": 0, "idem_outbox_sent": published, "idem_outbox_oldest_unsent_age_seconds": 0} {
		if v := gauge(name, exchange); v != want {
			t.Errorf("%s{destination=%s} = %v after the relay, want %v", name, exchange, v, want)
		}
	}
	for name, want := range map[string]float64{"idem_outbox_unsent": 0, "idem_outbox_parked": refused, "idem_outbox_sent": 0} {
		if v := gauge(name, missing); v != want {
			t.Errorf("%s{destination=%s} = %v after the relay, want %v", name, missing, v, want)
		}
	}
	if n, _ := value(t, reg, "idem_outbox_outages_total", nil); n != 0 {
		t.Errorf("outages counted with the broker up: %v", n)
	}

	// The broker goes away: the next record is an outage, counted and
	// waited out, not refused; it is published once the broker is back.
	broker.Stop()
	enqueue(t, ob, pool, outbox.Message{Destination: exchange, RoutingKey: queue, Key: "order-0", Body: []byte("after")})
	eventually(t, "an outage counted", func() bool {
		n, _ := value(t, reg, "idem_outbox_outages_total", nil)
		return n > 0
	})
	if wait, _ := value(t, reg, "idem_outbox_outage_wait_seconds_total", nil); wait <= 0 {
		t.Errorf("idem_outbox_outage_wait_seconds_total = %v during an outage", wait)
	}
	if n := gauge("idem_outbox_unsent", exchange); n != 1 {
		t.Errorf("unsent during the outage: %v, want 1", n)
	}
	if n := counter("idem_outbox_refused_total", exchange); n != 0 {
		t.Errorf("the outage counted as refusals: %v", n)
	}
	broker.Restore()
	eventually(t, "the record published after the outage", func() bool {
		return counter("idem_outbox_published_total", exchange) == published+1
	})

	// The operator creates the exchange and retries the parked rows, as
	// the alert's runbook says (idem outbox retry).
	ch, err := direct.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(missing, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, queue, missing, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(missing, false, false); _ = ch.Close() })
	if n, err := ob.Retry(ctx, outbox.RetryFilter{Destination: missing}); err != nil || n != refused {
		t.Fatalf("retry: %d rows, %v; want %d", n, err, refused)
	}
	eventually(t, "the retried rows published", func() bool {
		return counter("idem_outbox_published_total", missing) == refused
	})
	if n := gauge("idem_outbox_parked", missing); n != 0 {
		t.Errorf("parked after the retry: %v", n)
	}
	if n := gauge("idem_outbox_sent", missing); n != refused {
		t.Errorf("sent to %s after the retry: %v, want %d", missing, n, refused)
	}
	if n := queued(t, direct, queue); n != published+1+refused {
		t.Errorf("%d messages in the queue, want %d", n, published+1+refused)
	}
}

// TestOutboxCollectorDatabaseGone scrapes an outbox whose database stops
// answering (a proxy that goes silent, then one that cuts every
// connection), then whose table was dropped: each scrape answers, with
// the read counted as an error and the per-destination series withdrawn,
// and recovers when the database is back.
func TestOutboxCollectorDatabaseGone(t *testing.T) {
	ctx := outageContext(t)
	pool, proxy := pgtest.PoolBehindFault(t)
	ob := pgxOutbox(t, pool)
	enqueue(t, ob, pool, outbox.Message{Destination: "invoices", Key: "c-1", Body: []byte("x")})
	reg := prometheus.NewRegistry()
	coll := idemprom.NewOutboxCollector(ob, "billing_outbox", &idemprom.OutboxOptions{Interval: -1, Timeout: time.Second})
	reg.MustRegister(coll)
	table := map[string]string{"table": "billing_outbox"}
	gatherWithin(ctx, t, reg)
	if up, _ := value(t, reg, "idem_outbox_stats_up", table); up != 1 {
		t.Fatalf("before the outage: up %v (%v)", up, coll.Err())
	}
	if n, _ := value(t, reg, "idem_outbox_unsent", map[string]string{"table": "billing_outbox", "destination": "invoices"}); n != 1 {
		t.Fatalf("before the outage: %v unsent, want 1", n)
	}

	duringOutages(ctx, t, proxy, outage{
		reg: reg, coll: coll, up: "idem_outbox_stats_up", labels: table,
		during: func(t *testing.T, i int) {
			for _, name := range []string{"idem_outbox_unsent", "idem_outbox_oldest_unsent_age_seconds", "idem_outbox_parked", "idem_outbox_sent"} {
				if _, ok := value(t, reg, name, nil); ok {
					t.Errorf("%s still exported while it cannot be read", name)
				}
			}
			// Every gather above read once more.
			if errs, _ := value(t, reg, "idem_outbox_scrape_errors_total", table); errs < float64(2*i+1) {
				t.Errorf("idem_outbox_scrape_errors_total = %v, want at least %d", errs, 2*i+1)
			}
		},
		after: func(t *testing.T) {
			if n, _ := value(t, reg, "idem_outbox_unsent", map[string]string{"table": "billing_outbox", "destination": "invoices"}); n != 1 {
				t.Errorf("after the outage: %v unsent, want 1", n)
			}
		},
	})

	t.Run("table dropped", func(t *testing.T) {
		if _, err := pool.Exec(ctx, `DROP TABLE idem_outbox`); err != nil {
			t.Fatal(err)
		}
		gatherWithin(ctx, t, reg)
		if up, _ := value(t, reg, "idem_outbox_stats_up", table); up != 0 {
			t.Errorf("with the table dropped: up %v, want 0", up)
		}
		if err := coll.Err(); err == nil || !strings.Contains(err.Error(), "idem_outbox") {
			t.Errorf("with the table dropped: %v, want an error naming the table", err)
		}
		if errors.Is(coll.Err(), context.DeadlineExceeded) {
			t.Errorf("a dropped table reported as a timeout: %v", coll.Err())
		}
	})
}

// BenchmarkOutboxScrape is the cost of one scrape of an OutboxCollector
// that reads on every scrape (Interval -1), on an outbox of 10,000 unsent
// and 90,000 sent rows over 10 destinations: what a scrape costs the
// database at most once per Interval.
func BenchmarkOutboxScrape(b *testing.B) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Schema(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	ob, err := outbox.NewPgx(pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ob.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	const rows, batch = 100_000, 1000
	for from := 0; from < rows; from += batch {
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		msgs := make([]outbox.Message, batch)
		for i := range msgs {
			msgs[i] = outbox.Message{Destination: fmt.Sprintf("topic-%d", (from+i)%10), Key: fmt.Sprint((from + i) % 500), Body: []byte("x")}
		}
		if _, err := ob.Enqueue(ctx, tx, msgs...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_outbox SET sent_at = now() WHERE seq % 10 <> 0`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE idem_outbox`); err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	coll := idemprom.NewOutboxCollector(ob, "", &idemprom.OutboxOptions{Interval: -1, Timeout: time.Minute})
	reg.MustRegister(coll)
	b.ResetTimer()
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := coll.Err(); err != nil {
		b.Fatal(err)
	}
	st, err := ob.Stats(ctx)
	if err != nil || st.Unsent != rows/10 || len(st.Destinations) != 10 {
		b.Fatalf("stats: %d unsent over %d destinations (%v), want %d over 10", st.Unsent, len(st.Destinations), err, rows/10)
	}
}

// One Metrics serves the consumers and the outbox relay; the collector
// exports the outbox table's backlog and parked rows.
func ExampleNewOutboxCollector() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/billing")
	if err != nil {
		panic(err)
	}
	ob, err := outbox.NewPgx(pool, nil)
	if err != nil {
		panic(err)
	}
	conn, err := amqp.Dial("amqp://localhost/")
	if err != nil {
		panic(err)
	}
	pub, err := amqppub.New(conn, nil)
	if err != nil {
		panic(err)
	}
	m := idemprom.New(prometheus.DefaultRegisterer) // also in idem.Config.Hooks
	prometheus.MustRegister(idemprom.NewOutboxCollector(ob, "", nil))
	relay, err := outbox.NewRelay(ob, pub, &outbox.RelayConfig{Hooks: []idem.Hook{m}})
	if err != nil {
		panic(err)
	}
	_ = relay.Run(ctx)
}
