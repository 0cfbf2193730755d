package demo

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
)

type rabbitTransport struct {
	url    string
	suffix string
	log    *slog.Logger
	conn   *amqp.Connection
	topo   map[string]idemrabbitmq.Topology // side/stream → queue
}

func newRabbit(rawURL string, timeout time.Duration, log *slog.Logger) (*rabbitTransport, error) {
	if timeout == 0 {
		timeout = 24 * time.Hour // amqp091's dialer takes no "no limit"
	}
	conn, err := amqp.DialConfig(rawURL, amqp.Config{Dial: amqp.DefaultDial(timeout), Heartbeat: 10 * time.Second, Locale: "en_US"})
	if err != nil {
		return nil, fmt.Errorf("connecting to RabbitMQ at %s: %w", redact(rawURL), idembroker.RedactError(err, rawURL))
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &rabbitTransport{url: rawURL, suffix: hex.EncodeToString(b[:]), log: log, conn: conn, topo: map[string]idemrabbitmq.Topology{}}, nil
}

func redact(raw string) string { return idembroker.RedactURL(raw) }

func (r *rabbitTransport) describe() string { return "RabbitMQ " + redact(r.url) }

func (r *rabbitTransport) exchange(stream string) string {
	return "idem-demo-" + r.suffix + "." + stream
}

// prepare declares one fanout exchange per stream and, for each side, a
// quorum queue with its dead-letter queue bound to it: every message
// published reaches both sides.
func (r *rabbitTransport) prepare(_ context.Context, _ *plan) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("opening channel: %w", err)
	}
	defer ch.Close()
	for _, s := range streams {
		if err := ch.ExchangeDeclare(r.exchange(s), amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
			return fmt.Errorf("declaring exchange %s: %w", r.exchange(s), err)
		}
		for _, side := range []string{"naive", "idem"} {
			q := r.exchange(s) + "." + side
			t, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, q, nil)
			if err != nil {
				return err
			}
			r.topo[side+"/"+s] = t
			if err := ch.QueueBind(q, "", r.exchange(s), false, nil); err != nil {
				return fmt.Errorf("binding queue %s: %w", q, err)
			}
		}
	}
	return nil
}

func (r *rabbitTransport) publish(ctx context.Context, p *plan) error {
	pub, err := idemrabbitmq.NewPublisher(r.conn)
	if err != nil {
		return err
	}
	defer pub.Close()
	for _, s := range streams {
		evs := p.stream[s]
		for start := 0; start < len(evs); start += 1000 {
			msgs := make([]amqp.Publishing, 0, 1000)
			for _, ev := range evs[start:min(start+1000, len(evs))] {
				msgs = append(msgs, amqp.Publishing{MessageId: ev.id, ContentType: "application/json", Body: ev.body})
			}
			if err := pub.Publish(ctx, r.exchange(s), "", msgs...); err != nil {
				return fmt.Errorf("publishing to %s: %w", r.exchange(s), err)
			}
		}
	}
	return nil
}

func (r *rabbitTransport) start(ctx context.Context, s *side, stream string, proc *idem.Processor[*sql.Tx], o *outage, published int) runningConsumer {
	t := r.topo[s.name+"/"+stream]
	// A restart catches the batch committed and not yet acked: one worker
	// (several would update the same balances and stock rows in different
	// orders and wait on each other) with batches the size of the outage's
	// share, and a prefetch that lets the next batch queue up behind it.
	batch := min(30000, max(10, o.target))
	c := &rabbitConsumer{published: published, done: make(chan struct{})}
	cons, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{
		URL:                r.url,
		Queue:              t.Queue,
		BatchSize:          batch,
		BatchWait:          100 * time.Millisecond,
		Prefetch:           2 * batch,
		DeadLetterExchange: t.DeadLetterExchange,
		ReconnectBackoff:   idem.Backoff{Initial: 50 * time.Millisecond, Max: time.Second},
		ConnectionName:     "idem-demo-" + s.name + "-" + stream,
		Logger:             r.log,
		Faults: func(ctx context.Context, _ idem.FaultPoint, msgs []idem.Message) error {
			return o.hold(ctx, len(msgs))
		},
	})
	if err != nil {
		c.err = err
		close(c.done)
		return c
	}
	c.cons = cons
	go func() {
		defer close(c.done)
		if err := cons.Run(ctx); err != nil {
			c.err = fmt.Errorf("consuming %s: %w", t.Queue, err)
		}
	}()
	return c
}

func (r *rabbitTransport) close(context.Context) {
	if ch, err := r.conn.Channel(); err == nil {
		for _, t := range r.topo {
			_ = idemrabbitmq.DeleteTopology(ch, t)
		}
		for _, s := range streams {
			_ = ch.ExchangeDelete(r.exchange(s), false, false)
		}
		_ = ch.Close()
	}
	_ = r.conn.Close()
}

type rabbitConsumer struct {
	cons      *idemrabbitmq.Consumer[*sql.Tx]
	published int
	done      chan struct{}
	err       error
}

func (c *rabbitConsumer) acked() int {
	if c.cons == nil {
		return 0
	}
	s := c.cons.Stats()
	return int(s.Applied + s.Duplicates + s.DeadLettered)
}

func (c *rabbitConsumer) finished() bool { return c.acked() >= c.published }

func (c *rabbitConsumer) wait() error {
	<-c.done
	return c.err
}
