package dlq

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
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
	return "dlq-test-" + n + "-" + hex.EncodeToString(b)
}

// rabbitEnv is a work queue with its dead-letter queue, an inbox in a
// fresh schema and an effects table the handlers write.
type rabbitEnv struct {
	t        *testing.T
	conn     *amqp.Connection
	topo     idemrabbitmq.Topology
	pool     *pgxpool.Pool
	store    *pgxinbox.Store
	inbox    *Inbox
	consumer string
}

func newRabbitEnv(t *testing.T) *rabbitEnv {
	t.Helper()
	return newRabbitEnvOf(t, 0)
}

// newRabbitEnvOf is newRabbitEnv with an inbox pool of at most conns
// connections (0: pgx's default size), shared by the consumer, the dlq
// tools and the test's reads.
func newRabbitEnvOf(t *testing.T, conns int) *rabbitEnv {
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
	pool := pgtest.PoolOf(t, conns)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	in, err := NewInbox(pool, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	return &rabbitEnv{t: t, conn: conn, topo: topo, pool: pool, store: store, inbox: in, consumer: "billing-invoice"}
}

// publish publishes messages to the work queue, confirmed.
func (e *rabbitEnv) publish(msgs ...amqp.Publishing) {
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
	return amqp.Publishing{MessageId: id, ContentType: "application/json", Timestamp: time.Now(), Body: []byte(`{"invoice":"` + id + `"}`)}
}

// settled collects what a consumer settled, by message ID.
type settled struct {
	mu   sync.Mutex
	seen []idem.Result
	n    atomic.Int64
}

func (s *settled) OnSettle(_, _ string, _ idem.Disposition, r idem.Result) {
	s.mu.Lock()
	s.seen = append(s.seen, r)
	s.mu.Unlock()
	s.n.Add(1)
}

func (s *settled) outcomes() map[string][]idem.Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string][]idem.Outcome{}
	for _, r := range s.seen {
		m[r.MessageID] = append(m[r.MessageID], r.Outcome)
	}
	return m
}

// errPoison is the broken handler's refusal.
var errPoison = errors.New("tax rate missing for region")

// consume runs a consumer of the work queue until it settled n messages,
// then stops it. broken makes its handler fail permanently.
func (e *rabbitEnv) consume(n int, broken bool) map[string][]idem.Outcome {
	e.t.Helper()
	proc, err := idem.NewProcessor(e.store, &idem.Config[pgx.Tx]{
		Consumer: e.consumer,
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			if broken {
				return idem.Permanent(errPoison)
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
			return err
		},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	s := &settled{}
	c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: amqpURL(), Queue: e.topo.Queue, BatchSize: 1, Hooks: []idem.Hook{s}})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	deadline := time.After(time.Minute)
	for s.n.Load() < int64(n) {
		select {
		case err := <-errc:
			cancel()
			e.t.Fatalf("consumer stopped: %v", err)
		case <-deadline:
			cancel()
			e.t.Fatalf("consumer settled %d of %d messages in a minute", s.n.Load(), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		e.t.Fatalf("consumer: %v", err)
	}
	return s.outcomes()
}

// depth is the count of ready messages in queue.
func (e *rabbitEnv) depth(queue string) int {
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

// effects counts the effects of message id.
func (e *rabbitEnv) effects(id string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// source opens the dead-letter queue.
func (e *rabbitEnv) source() *RabbitMQ {
	e.t.Helper()
	src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: e.topo.DeadLetterQueue})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = src.Close() })
	return src
}

// poison dead-letters the messages with ids through a consumer whose
// handler is broken.
func (e *rabbitEnv) poison(ids ...string) {
	e.t.Helper()
	var msgs []amqp.Publishing
	for _, id := range ids {
		msgs = append(msgs, invoice(id))
	}
	e.publish(msgs...)
	out := e.consume(len(ids), true)
	for _, id := range ids {
		if o := out[id]; len(o) != 1 || o[0] != idem.DeadLettered {
			e.t.Fatalf("message %s: outcomes %v, want one dead_lettered", id, o)
		}
	}
	if n := e.depth(e.topo.DeadLetterQueue); n != len(ids) {
		e.t.Fatalf("dead-letter queue holds %d, want %d", n, len(ids))
	}
}

// settledDepth is depth once the queue holds want (a quorum queue takes
// back the messages of a closed connection a moment later), or after ten
// seconds whatever it holds then.
func (e *rabbitEnv) settledDepth(queue string, want int) int {
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
