package idemrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/adaptertest"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
)

// The adapter conformance suite against the real RabbitMQ: every check
// every broker adapter passes.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, newConformanceHarness(t))
}

// conformanceHarness gives the suite quorum queues declared with
// DeclareQuorumWithDLQ and consumers built with NewConsumer.
type conformanceHarness struct {
	conn *amqp.Connection // topology, publishing, reading dead letters
	mu   sync.Mutex
	dead map[string][]adaptertest.DeadLetter // queue → dead letters read
}

func newConformanceHarness(t *testing.T) *conformanceHarness {
	conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable (%v); %s", redact(amqpURL()), err, amqpFixHint)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &conformanceHarness{conn: conn, dead: map[string][]adaptertest.DeadLetter{}}
}

func (h *conformanceHarness) Features() adaptertest.Features {
	return adaptertest.Features{
		// One consumer with one worker (the default) on a queue.
		Ordered:                    true,
		ErrNoDeadLetterDestination: idemrabbitmq.ErrNoDeadLetterDestination,
		StopWithin:                 5 * time.Second,
	}
}

func (h *conformanceHarness) channel(t testing.TB) *amqp.Channel {
	t.Helper()
	ch, err := h.conn.Channel()
	if err != nil {
		t.Fatalf("opening a channel: %v", err)
	}
	return ch
}

func (h *conformanceHarness) Topic(t testing.TB) string {
	t.Helper()
	ch := h.channel(t)
	defer ch.Close()
	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, uniqueName(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch, err := h.conn.Channel()
		if err != nil {
			t.Logf("deleting %s: %v", topo.Queue, err)
			return
		}
		defer ch.Close()
		if err := idemrabbitmq.DeleteTopology(ch, topo); err != nil {
			t.Logf("deleting %s: %v", topo.Queue, err)
		}
	})
	return topo.Queue
}

func (h *conformanceHarness) Publish(t testing.TB, queue string, msgs ...adaptertest.Message) {
	t.Helper()
	ch := h.channel(t)
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		p := amqp.Publishing{MessageId: m.ID, Body: m.Body, Timestamp: m.Timestamp, DeliveryMode: amqp.Persistent}
		if !m.EventTime.IsZero() {
			p.Headers = amqp.Table{idembroker.HeaderEventTime: m.EventTime.UTC().Format(time.RFC3339Nano)}
		}
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
		if err != nil {
			t.Fatalf("publishing to %s: %v", queue, err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publishing to %s: confirmed %v, %v", queue, ok, err)
		}
	}
}

// conformanceConsumer is a Consumer whose connection the suite can cut.
type conformanceConsumer struct {
	*idemrabbitmq.Consumer[pgx.Tx]
}

func (c conformanceConsumer) Cut() bool { return c.DropConnection() }

func (h *conformanceHarness) Consumer(t testing.TB, queue string, proc *idem.Processor[pgx.Tx], opts adaptertest.ConsumerOptions) adaptertest.Consumer {
	t.Helper()
	cfg := &idemrabbitmq.Config{
		URL:              amqpURL(),
		Queue:            queue,
		BatchSize:        opts.BatchSize,
		ConnectionName:   uniqueName(t),
		ReconnectBackoff: idem.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		ShutdownGrace:    time.Second,
		Logger:           opts.Logger,
	}
	if opts.NoDeadLetterDestination {
		cfg.DeadLetterExchange = queue + ".no-such-exchange"
	}
	if opts.CrashBeforeAck {
		var once sync.Once
		cfg.Faults = func(_ context.Context, point idem.FaultPoint, _ []idem.Message) (err error) {
			if point == idemrabbitmq.BeforeSettle {
				once.Do(func() { err = errors.New("process died between commit and ack") })
			}
			return err
		}
	}
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return conformanceConsumer{c}
}

func (h *conformanceHarness) DeadLetters(t testing.TB, queue string) []adaptertest.DeadLetter {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.channel(t)
	defer ch.Close()
	for {
		d, ok, err := ch.Get(queue+".dlq", true)
		if err != nil {
			t.Fatalf("reading %s.dlq: %v", queue, err)
		}
		if !ok {
			break
		}
		dl := adaptertest.DeadLetter{ID: d.MessageId, Body: d.Body, Headers: map[string]string{}}
		for k, v := range d.Headers {
			if b, isBytes := v.([]byte); isBytes {
				v = string(b)
			}
			dl.Headers[k] = fmt.Sprint(v)
		}
		h.dead[queue] = append(h.dead[queue], dl)
	}
	return append([]adaptertest.DeadLetter(nil), h.dead[queue]...)
}

func (h *conformanceHarness) DropDeadLetters(t testing.TB, queue string) {
	t.Helper()
	ch := h.channel(t)
	defer ch.Close()
	if _, err := ch.QueueDelete(queue+".dlq", false, false, false); err != nil {
		t.Fatalf("deleting %s.dlq: %v", queue, err)
	}
}

func (h *conformanceHarness) RestoreDeadLetters(t testing.TB, queue string) {
	t.Helper()
	ch := h.channel(t)
	defer ch.Close()
	// The declarations are idempotent: this declares the dead-letter
	// queue again and binds it to its exchange.
	if _, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, queue, nil); err != nil {
		t.Fatal(err)
	}
}
