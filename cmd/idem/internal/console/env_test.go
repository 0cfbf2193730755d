package console

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/audit"
	"github.com/idemkit/idem/dlq"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"

	"github.com/idemkit/idem/internal/amqptest"
)

// amqpURL is the test broker: see [amqptest.URL].
func amqpURL() string { return amqptest.URL() }

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

func uniqueName(t testing.TB) string {
	n := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	return "console-test-" + n + "-" + hex.EncodeToString(b)
}

// env is a work queue with its dead-letter queue, an inbox in a fresh
// schema, an effects table the handler writes, and two guarded tables.
type env struct {
	t     *testing.T
	conn  *amqp.Connection
	topo  idemrabbitmq.Topology
	pool  *pgxpool.Pool
	store *pgxinbox.Store
	inbox *dlq.Inbox
}

const consumer = "billing-invoice"

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable (%v); start it with: rabbitmq-server -detached && rabbitmqctl await_startup (or run make test), or set IDEM_AMQP_URL", amqpURL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, uniqueName(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_ = idemrabbitmq.DeleteTopology(ch, topo)
		}
	})
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE effects (message_id text NOT NULL, body text NOT NULL)`,
		`CREATE TABLE invoices (id bigserial PRIMARY KEY, customer_id int NOT NULL, period text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), status text NOT NULL DEFAULT 'Open')`,
		`INSERT INTO invoices (customer_id, period) VALUES (1, '2026-11'), (1, '2026-11'), (2, '2026-11')`,
		`CREATE TABLE payments (id bigserial PRIMARY KEY, invoice_id int NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), status text NOT NULL DEFAULT 'Open')`,
		`CREATE UNIQUE INDEX payments_invoice_once ON payments (invoice_id) WHERE status <> 'VoidedDuplicate'`,
		`INSERT INTO payments (invoice_id) VALUES (1), (2)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	in, err := dlq.NewInbox(pool, &dlq.InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, conn: conn, topo: topo, pool: pool, store: store, inbox: in}
}

func (e *env) publish(msgs ...amqp.Publishing) {
	e.t.Helper()
	pub, err := idemrabbitmq.NewPublisher(e.conn)
	if err != nil {
		e.t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(context.Background(), "", e.topo.Queue, msgs...); err != nil {
		e.t.Fatal(err)
	}
}

func invoice(id string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, ContentType: "application/json", Timestamp: time.Now(), Body: []byte(`{"invoice":"` + id + `","amount":"120.00"}`)}
}

type counter struct{ n atomic.Int64 }

func (c *counter) OnSettle(string, string, idem.Disposition, idem.Result) { c.n.Add(1) }

// consume runs a consumer of the work queue until it settled n messages.
// fail, when set, makes the handler refuse a message permanently.
func (e *env) consume(n int, fail func(idem.Message) error) {
	e.t.Helper()
	proc, err := idem.NewProcessor(e.store, &idem.Config[pgx.Tx]{
		Consumer: consumer,
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			if fail != nil {
				if err := fail(m); err != nil {
					return idem.Permanent(err)
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
			return err
		},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	c := &counter{}
	cons, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: amqpURL(), Queue: e.topo.Queue, BatchSize: 1, Hooks: []idem.Hook{c}})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- cons.Run(ctx) }()
	deadline := time.After(time.Minute)
	for c.n.Load() < int64(n) {
		select {
		case err := <-errc:
			cancel()
			e.t.Fatalf("consumer stopped: %v", err)
		case <-deadline:
			cancel()
			e.t.Fatalf("consumer settled %d of %d messages in a minute", c.n.Load(), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		e.t.Fatalf("consumer: %v", err)
	}
}

func (e *env) depth(queue string) int {
	e.t.Helper()
	ch, err := e.conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Messages
}

// settledDepth waits up to ten seconds for queue to hold want.
func (e *env) settledDepth(queue string, want int) int {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := e.depth(queue)
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) effects(id string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

var errTaxRate = errors.New("tax rate missing for region EU-HR")

// seed applies good messages, spreads their markers over the last days,
// and dead-letters poison ones: poisoned are refused for a missing tax
// rate, and one more is refused as malformed.
func (e *env) seed(good int, poisoned []string) {
	e.t.Helper()
	var msgs []amqp.Publishing
	for i := range good {
		m := invoice(fmt.Sprintf("inv-%04d", i))
		if i%7 == 0 {
			m.Timestamp = time.Time{} // untimed
		}
		msgs = append(msgs, m)
	}
	e.publish(msgs...)
	e.consume(good, nil)
	// The markers were written now; spread them back over the last ten
	// days and hours, as a consumer running for a while leaves them.
	if _, err := e.pool.Exec(context.Background(), `UPDATE idem_inbox SET processed_at = processed_at - ((hashtext(key) & 255) % 240) * interval '1 hour' * (CASE WHEN (hashtext(key) & 1) = 0 THEN 0.1 ELSE 1 END) WHERE consumer = $1`, consumer); err != nil {
		e.t.Fatal(err)
	}
	msgs = msgs[:0]
	for _, id := range poisoned {
		msgs = append(msgs, invoice(id))
	}
	bad := invoice("inv-malformed")
	bad.Body = []byte(`{"invoice":`)
	msgs = append(msgs, bad)
	e.publish(msgs...)
	e.consume(len(msgs), func(m idem.Message) error {
		if m.ID == "inv-malformed" {
			return errors.New("decoding invoice: unexpected end of JSON input")
		}
		return fmt.Errorf("invoice %s: %w", m.ID, errTaxRate)
	})
	if n := e.settledDepth(e.topo.DeadLetterQueue, len(msgs)); n != len(msgs) {
		e.t.Fatalf("dead-letter queue holds %d, want %d", n, len(msgs))
	}
}

// server starts a console over the env's DLQ and guarded tables.
func (e *env) server(token string, readOnly bool) (*Server, *httptest.Server) {
	e.t.Helper()
	src, err := dlq.NewRabbitMQ(dlq.RabbitMQConfig{URL: amqpURL(), Queue: e.topo.DeadLetterQueue})
	if err != nil {
		e.t.Fatal(err)
	}
	var guards []*audit.Auditor
	for _, sp := range []audit.Spec{{Table: "invoices", Key: []string{"customer_id", "period"}}, {Table: "payments", Key: []string{"invoice_id"}}} {
		a, err := audit.New(e.pool, sp)
		if err != nil {
			e.t.Fatal(err)
		}
		guards = append(guards, a)
	}
	s, err := New(Config{Inbox: e.inbox, DB: e.pool, Sources: []dlq.Source{src}, Guards: guards, Token: token, ReadOnly: readOnly,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		e.t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	e.t.Cleanup(func() {
		ts.Close()
		_ = s.Close()
	})
	return s, ts
}

// get fetches path and returns the status and body.
func get(t *testing.T, ts *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// post sends a form as a same-origin browser would, then mod's changes.
func post(t *testing.T, ts *httptest.Server, path string, form url.Values, mod func(*http.Request)) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", ts.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if mod != nil {
		mod(req)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

var hidden = regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`)

// formOf reads the hidden fields of a confirmation form.
func formOf(t *testing.T, page string) url.Values {
	t.Helper()
	v := url.Values{}
	for _, m := range hidden.FindAllStringSubmatch(page, -1) {
		v.Set(m[1], htmlUnescape(m[2]))
	}
	if v.Get("form") == "" {
		t.Fatalf("no confirmation form in the page:\n%s", page)
	}
	return v
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&lt;", "<", "&gt;", ">", "&#34;", `"`, "&#39;", "'", "&amp;", "&").Replace(s)
}
