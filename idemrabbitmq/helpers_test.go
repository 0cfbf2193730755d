package idemrabbitmq_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testrun"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"

	"github.com/idemkit/idem/internal/amqptest"
)

// amqpFixHint is the command that brings the test broker up.
const amqpFixHint = "start it with: rabbitmq-server -detached && rabbitmqctl await_startup (or run make test), or set IDEM_AMQP_URL"

// amqpURL is the test broker: see [amqptest.URL].
func amqpURL() string { return amqptest.URL() }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

// uniqueName is a queue or connection name for t that no concurrent test,
// in this package or another developer's, will ever use.
func uniqueName(t testing.TB) string {
	n := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return "idemrabbitmq-test-" + n + "-" + randomHex(4)
}

// broker opens a connection for the test's own topology and publishing,
// failing with the fix when RabbitMQ is down.
func broker(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable (%v); %s", redact(amqpURL()), err, amqpFixHint)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}

// topology declares a fresh quorum queue with its dead-letter queue and
// deletes all of it when t ends.
func topology(t testing.TB, conn *amqp.Connection, opts *idemrabbitmq.TopologyOptions) idemrabbitmq.Topology {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, uniqueName(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The test's own connection may be gone by now; use a new one.
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			t.Logf("deleting %s: %v", topo.Queue, err)
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			t.Logf("deleting %s: %v", topo.Queue, err)
			return
		}
		if err := idemrabbitmq.DeleteTopology(ch, topo); err != nil {
			t.Logf("deleting %s: %v", topo.Queue, err)
		}
	})
	return topo
}

// classicTopology declares a fresh classic queue (no delivery limit, no
// x-delivery-count) that dead-letters to its own exchange and queue, and
// deletes all of it when t ends.
func classicTopology(t testing.TB, conn *amqp.Connection) idemrabbitmq.Topology {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q := uniqueName(t)
	topo := idemrabbitmq.Topology{Queue: q, DeadLetterExchange: q + ".dlx", DeadLetterQueue: q + ".dlq"}
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			t.Logf("deleting %s: %v", q, err)
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			t.Logf("deleting %s: %v", q, err)
			return
		}
		if err := idemrabbitmq.DeleteTopology(ch, topo); err != nil {
			t.Logf("deleting %s: %v", q, err)
		}
	})
	classic := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}
	if err := ch.ExchangeDeclare(topo.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(topo.DeadLetterQueue, true, false, false, false, classic); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(topo.DeadLetterQueue, q, topo.DeadLetterExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg:           amqp.QueueTypeClassic,
		"x-dead-letter-exchange":    topo.DeadLetterExchange,
		"x-dead-letter-routing-key": q,
	}); err != nil {
		t.Fatal(err)
	}
	return topo
}

func msgID(i int) string { return fmt.Sprintf("inv-%06d", i) }

// publish publishes messages from..from+n-1 with IDs from id, confirmed.
func publish(t testing.TB, conn *amqp.Connection, queue string, from, n int, id func(int) string) {
	t.Helper()
	pub, err := idemrabbitmq.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := make([]amqp.Publishing, 0, n)
	for i := from; i < from+n; i++ {
		msgs = append(msgs, amqp.Publishing{
			MessageId:   id(i),
			ContentType: "application/json",
			Timestamp:   time.Now(),
			Body:        fmt.Appendf(nil, `{"customer":"cus-%d","period":"2026-09"}`, i),
		})
	}
	if err := pub.Publish(context.Background(), "", queue, msgs...); err != nil {
		t.Fatal(err)
	}
}

// depth is the number of messages in queue that no consumer holds.
func depth(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting %s: %v", queue, err)
	}
	return q.Messages
}

// waitConsuming waits until a consumer is attached to queue: the consumer
// under test passed its start checks.
func waitConsuming(t testing.TB, conn *amqp.Connection, queue string) {
	t.Helper()
	poll(t, 10*time.Second, "a consumer on "+queue, func() bool {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("inspecting %s: %v", queue, err)
		}
		return q.Consumers > 0
	})
}

// drain takes every message of queue (a dead-letter queue) with basic.get.
func drain(t testing.TB, conn *amqp.Connection, queue string) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("reading %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// db is a PostgreSQL schema with an inbox and an effects table that has NO
// unique constraint: a message applied twice shows as two rows.
type db struct {
	url  string
	pool *pgxpool.Pool
}

func newDB(t testing.TB, appName string) *db {
	t.Helper()
	u, err := url.Parse(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", appName)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (key text NOT NULL, message_id text NOT NULL, attempt int NOT NULL)`); err != nil {
		t.Fatalf("creating effects: %v (%s)", err, pgtest.FixHint)
	}
	return &db{url: u.String(), pool: pool}
}

func write(ctx context.Context, tx pgx.Tx, m idem.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (key, message_id, attempt) VALUES ($1, $2, $3)`, m.ID, m.ID, m.Attempt)
	return err
}

// processor is the billing consumer's processor over d's inbox.
func (d *db) processor(t testing.TB, h idem.Handler[pgx.Tx], mod ...func(*idem.Config[pgx.Tx])) *idem.Processor[pgx.Tx] {
	t.Helper()
	return d.processorOn(t, d.pool, h, mod...)
}

// processorOn is processor on another pool of d's schema.
func (d *db) processorOn(t testing.TB, pool *pgxpool.Pool, h idem.Handler[pgx.Tx], mod ...func(*idem.Config[pgx.Tx])) *idem.Processor[pgx.Tx] {
	t.Helper()
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h == nil {
		h = write
	}
	cfg := &idem.Config[pgx.Tx]{
		Consumer: "billing-invoice",
		Key:      idem.ByMessageID,
		Handler:  h,
		Logger:   quiet,
	}
	for _, m := range mod {
		m(cfg)
	}
	p, err := idem.NewProcessor(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// effects returns the rows of the effects table and their distinct keys.
func (d *db) effects(t testing.TB) (rows, distinct int) {
	t.Helper()
	if err := d.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT key) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// config is the consumer configuration tests start from.
func config(t testing.TB, queue string) *idemrabbitmq.Config {
	return &idemrabbitmq.Config{
		URL:              amqpURL(),
		Queue:            queue,
		ConnectionName:   uniqueName(t),
		ReconnectBackoff: idem.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:           quiet,
	}
}

// settlements records what the consumer told the broker, and signals every
// change so tests wait for conditions instead of sleeping.
type settlements struct {
	mu      sync.Mutex
	acked   map[string]int // message ID → acks
	dead    map[string]int
	onAck   func(idem.Result)
	changed chan struct{}
}

func newSettlements() *settlements {
	return &settlements{acked: map[string]int{}, dead: map[string]int{}, changed: make(chan struct{}, 1)}
}

func (s *settlements) OnSettle(_, _ string, d idem.Disposition, r idem.Result) {
	v := idemrabbitmq.VerbFor(d.Action)
	if v == idemrabbitmq.Ack && s.onAck != nil {
		s.onAck(r)
	}
	s.mu.Lock()
	switch v {
	case idemrabbitmq.Ack:
		s.acked[r.MessageID]++
	case idemrabbitmq.DeadLetter:
		s.dead[r.MessageID]++
	}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// distinctAcked is how many different messages were acked.
func (s *settlements) distinctAcked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked)
}

func (s *settlements) deadLettered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.dead)
}

// waitUntil waits for cond, re-checking on every settlement.
func (s *settlements) waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-s.changed:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// poll waits for cond on state the consumer does not signal (a queue the
// broker fills asynchronously), re-checking every 20ms.
func poll(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

// run starts c in the background; stop cancels it and returns Run's error.
func run[TTx any](t testing.TB, c *idemrabbitmq.Consumer[TTx]) (stop func() error) {
	t.Helper()
	return testrun.Start(t, c, 30*time.Second)
}

// closeByName closes, through rabbitmqctl, only the broker connections whose
// client-provided name is name: other developers' tests share the broker. It
// reports whether rabbitmqctl is present and closed at least one.
func closeByName(t testing.TB, name string) bool {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		return false
	}
	out, err := exec.Command("rabbitmqctl", "list_connections", "pid", "client_properties", "-q", "--no-table-headers").Output()
	if err != nil {
		t.Logf("rabbitmqctl list_connections: %v", err)
		return false
	}
	closed := false
	for _, line := range strings.Split(string(out), "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if !ok || !strings.Contains(props, `{"connection_name","`+name+`"}`) {
			continue
		}
		if err := exec.Command("rabbitmqctl", "close_connection", pid, "idem test: broker-side close").Run(); err != nil {
			t.Logf("rabbitmqctl close_connection %s: %v", pid, err)
			continue
		}
		closed = true
	}
	return closed
}

// poolVia is a pool on d's schema whose connections go through a new
// proxy; params are added to its URL (connect_timeout=1).
func (d *db) poolVia(t testing.TB, params ...string) (*pgxpool.Pool, *netfault.Proxy) {
	t.Helper()
	u, err := url.Parse(d.url)
	if err != nil {
		t.Fatal(err)
	}
	p := netfault.New(t, u.Host)
	u.Host = p.Addr()
	q := u.Query()
	for _, kv := range params {
		k, v, _ := strings.Cut(kv, "=")
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// brokerHost is the test broker's host:port.
func brokerHost(t testing.TB) string {
	t.Helper()
	u, err := amqp.ParseURI(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(u.Host, fmt.Sprint(u.Port))
}

// uuidV7 is a UUIDv7 whose time is at.
func uuidV7(at time.Time) string { return idem.NewUUIDv7(at) }
