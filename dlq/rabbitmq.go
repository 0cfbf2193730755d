package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
)

// RabbitMQConfig names a RabbitMQ dead-letter queue.
type RabbitMQConfig struct {
	// URL is the broker's AMQP URI. Required.
	URL string
	// Queue is the dead-letter queue ("billing.dlq"). Required.
	Queue string
	// IDHeader is the header carrying the message ID when the consumer
	// reads it from one (idemrabbitmq.Config.IDHeader); empty: message_id.
	IDHeader string
	// Target is where letters that name no origin are redriven to. Empty:
	// such letters are refused.
	Target string
	// ConfirmTimeout bounds the wait for the broker's confirm of one
	// republish. Defaults to 30s.
	ConfirmTimeout time.Duration
	// DeliveryLimit is the queue's delivery limit, if it is a quorum queue
	// with one: a letter returned to the queue more often is dropped (a
	// DLQ has no dead-letter exchange of its own). AMQP cannot read a
	// queue's arguments or policy, so it is given here. 0: 20, RabbitMQ
	// 4's default for quorum queues; negative: the queue has none.
	//
	// Each read returns the letters, and a quorum queue counts every
	// return (the letter's x-delivery-count header). A read that finds a
	// letter returned so often that fewer than two more reads would keep
	// it fails with [ErrDeliveryLimit] (the letters are returned once
	// more), leaving it for a redrive or purge with Apply, which takes it
	// out without returning it; a listing warns from half the limit.
	DeliveryLimit int
}

// ErrDeliveryLimit is returned by a read of a RabbitMQ DLQ whose letters
// are close to the queue's delivery limit ([RabbitMQConfig.DeliveryLimit]).
var ErrDeliveryLimit = errors.New("dead letters close to the queue's delivery limit")

// defaultDeliveryLimit is RabbitMQ 4's delivery limit of quorum queues.
const defaultDeliveryLimit = 20

// readsLeft is how many reads that return a letter there must still be
// after this one for a read to go on without refusing.
const readsLeft = 2

// RabbitMQ is a dead-letter queue on RabbitMQ. Reading it takes messages
// without acknowledging them and returns them when done (closing the
// channel), so a read leaves the queue as it was; a redriven letter is
// acknowledged only after the broker confirmed its republish.
//
// While a read or a walk holds the letters, another one sees only those it
// does not hold (a concurrent list may find the queue empty): a program
// that reads often, such as a web page, reads through one [RabbitMQ] at a
// time and keeps what it read for a moment.
//
// Each read counts as a delivery on a quorum queue: one with a delivery
// limit (RabbitMQ 4 gives quorum queues a default of 20) drops or
// dead-letters a message read that many times. Give dead-letter queues no
// delivery limit (a policy with delivery-limit -1 on RabbitMQ 4); until
// then, a read refuses to go on near the limit
// ([RabbitMQConfig.DeliveryLimit]).
type RabbitMQ struct {
	cfg  RabbitMQConfig
	conn *amqp.Connection

	// afterConfirm runs between the republish's confirm and the ack of the
	// dead-letter copy (fault injection in tests).
	afterConfirm func(*Letter)

	mu       sync.Mutex
	warnings []string
}

// Warnings says what the last read found that an operator must know:
// letters the queue counted as delivered often enough to near its
// delivery limit.
func (r *RabbitMQ) Warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.warnings)
}

// limits checks the delivery counts of the letters a read returns to the
// queue: a warning from half the delivery limit, [ErrDeliveryLimit] when
// fewer than readsLeft more reads would keep one.
func (r *RabbitMQ) limits(returned []Letter) error {
	limit := r.cfg.DeliveryLimit
	if limit == 0 {
		limit = defaultDeliveryLimit
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warnings = nil
	if limit < 0 || len(returned) == 0 {
		return nil
	}
	worst, id, near := -1, "", 0
	for i := range returned {
		// This read returns it once more.
		c := headerInt(returned[i].Headers["x-delivery-count"]) + 1
		if c > worst {
			worst, id = c, returned[i].ID
		}
		if limit-c < readsLeft {
			near++
		}
	}
	if near > 0 {
		return fmt.Errorf("%w: %d letters of %s (%q the most) were returned to it %d times of its delivery limit %d, and a read returns every letter it does not take out: %d more reads drop it for good; take them out now with a redrive or purge with --apply (no dry run, no list, no show), or give the queue no delivery limit (a policy with delivery-limit -1); a queue that has none already (RabbitMQ 3, or such a policy) is read with a delivery limit of -1 (idem dlq --delivery-limit -1)",
			ErrDeliveryLimit, near, r.cfg.Queue, id, worst, limit, max(0, limit-worst))
	}
	if worst*2 >= limit {
		r.warnings = append(r.warnings, fmt.Sprintf("letter %q of %s was returned to the queue %d times of its delivery limit %d: every read counts as a delivery on a quorum queue, and the broker drops a letter past the limit; act on the letters soon, or give the queue no delivery limit (a policy with delivery-limit -1)", id, r.cfg.Queue, worst, limit))
	}
	return nil
}

// NewRabbitMQ connects to the broker and checks that the queue exists.
func NewRabbitMQ(cfg RabbitMQConfig) (*RabbitMQ, error) {
	if cfg.URL == "" || cfg.Queue == "" {
		return nil, errors.New("dlq: RabbitMQ needs a URL and a queue")
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 30 * time.Second
	}
	conn, err := amqp.DialConfig(cfg.URL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second), Properties: amqp.Table{"connection_name": "idem-dlq"}})
	if err != nil {
		return nil, fmt.Errorf("connecting to RabbitMQ: %w", idem.RedactError(err, cfg.URL))
	}
	r := &RabbitMQ{cfg: cfg, conn: conn}
	if _, err := r.depth(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return r, nil
}

// Name says which queue.
func (r *RabbitMQ) Name() string { return "rabbitmq queue " + r.cfg.Queue }

// Close closes the connection; letters held are returned to the queue.
func (r *RabbitMQ) Close() error { return r.conn.Close() }

// depth is the count of messages ready in the queue.
func (r *RabbitMQ) depth() (int, error) {
	ch, err := r.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("opening a channel: %w", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(r.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("dead-letter queue %s: %w", r.cfg.Queue, err)
	}
	return q.Messages, nil
}

// letter turns the n-th delivery into a letter.
func (r *RabbitMQ) letter(d *amqp.Delivery, n int) Letter {
	m := idemrabbitmq.Message(d, r.cfg.Queue, r.cfg.IDHeader)
	l := Letter{
		ID: m.ID, DLQ: r.cfg.Queue, Position: "#" + strconv.Itoa(n),
		Reason: m.Headers[HeaderReason], Outcome: m.Headers[HeaderOutcome], Consumer: m.Headers[HeaderConsumer],
		Attempts: headerInt(m.Headers[HeaderAttempts]), Origin: m.Headers[HeaderOrigin], Redriven: headerInt(m.Headers[HeaderRedriven]),
		Time: m.Time, TimeSource: m.TimeSource, TimeFrom: m.TimeSource.String(), Key: d.RoutingKey, Headers: m.Headers, Body: d.Body,
	}
	if l.Origin == "" {
		// Dead-lettered by the broker (delivery limit, rejection).
		l.Origin = m.Headers["x-first-death-queue"]
	}
	if l.Reason == "" {
		if why := m.Headers["x-first-death-reason"]; why != "" {
			l.Reason = "broker: " + why
		} else {
			l.Reason = "unknown"
		}
	}
	l.Target = l.Origin
	if l.Target == "" {
		l.Target = r.cfg.Target
	}
	return l
}

// quietRead is how long a read waits for a message the queue counted.
const quietRead = 2 * time.Second

// Peek reads up to limit letters and returns them all to the queue. It
// consumes (the broker pushes the messages, far faster than one get per
// message), holds every delivery unacknowledged, and closes the channel.
func (r *RabbitMQ) Peek(ctx context.Context, limit int) ([]Letter, error) {
	before, err := r.depth()
	if err != nil {
		return nil, err
	}
	n := before
	if limit > 0 {
		n = min(n, limit)
	}
	if n == 0 {
		return nil, nil
	}
	ch, err := r.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a channel: %w", err)
	}
	defer func() {
		_ = ch.Close()
		r.settle(ctx, before)
	}()
	prefetch := n // every delivery is held until the end
	if prefetch > 65535 {
		prefetch = 0 // unlimited
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("setting the prefetch: %w", err)
	}
	ds, err := ch.ConsumeWithContext(ctx, r.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", r.cfg.Queue, err)
	}
	out := make([]Letter, 0, n)
	quiet := time.NewTimer(quietRead)
	defer quiet.Stop()
	for len(out) < n {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-quiet.C:
			// Fewer than counted: some are still on their way back from
			// another reader.
			if err := r.limits(out); err != nil {
				return nil, err
			}
			return out, nil
		case d, ok := <-ds:
			if !ok {
				return nil, fmt.Errorf("reading %s: the channel closed", r.cfg.Queue)
			}
			out = append(out, r.letter(&d, len(out)+1))
			quiet.Reset(quietRead)
		}
	}
	if err := r.limits(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Walk gets the messages there are now, without acknowledging them, and
// hands each to decide. A Send is republished (mandatory, persistent,
// with a publisher confirm) to the default exchange with the target queue
// as routing key, and acknowledged in the DLQ once confirmed; a Drop is
// acknowledged; a Keep is held until the walk ends, then returned to the
// queue with the others.
func (r *RabbitMQ) Walk(ctx context.Context, limit int, decide func(*Letter) (Action, error), done func(*Letter, Action, bool)) error {
	before, err := r.depth()
	if err != nil {
		return err
	}
	n := before
	if limit > 0 {
		n = min(n, limit)
	}
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel: %w", err)
	}
	removed := 0
	defer func() {
		// Closing the channel returns every message not acknowledged. A
		// quorum queue takes them back a moment later: wait for them, so
		// that the next read finds the queue as this one left it.
		_ = ch.Close()
		r.settle(ctx, before-removed)
	}()
	var pub *amqp.Channel
	var returns chan amqp.Return
	var kept []Letter
	walkErr := func(err error) error {
		if lerr := r.limits(kept); lerr != nil {
			return errors.Join(err, lerr)
		}
		return err
	}
	for i := 1; i <= n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok, err := ch.Get(r.cfg.Queue, false)
		if err != nil {
			return fmt.Errorf("reading %s: %w", r.cfg.Queue, err)
		}
		if !ok {
			break
		}
		l := r.letter(&d, i)
		act, err := decide(&l)
		if err != nil {
			return walkErr(err)
		}
		switch act {
		case Keep:
			kept = append(kept, l)
			continue
		case Drop:
			if err := d.Ack(false); err != nil {
				return fmt.Errorf("acknowledging %q in %s (it stays): %w", l.ID, r.cfg.Queue, err)
			}
			removed++
			report(done, &l, act, true)
			continue
		}
		if l.Target == "" {
			return fmt.Errorf("letter %q names no origin queue to redrive to", l.ID)
		}
		if pub == nil {
			if pub, err = r.conn.Channel(); err != nil {
				return fmt.Errorf("opening the publishing channel: %w", err)
			}
			defer pub.Close()
			if err := pub.Confirm(false); err != nil {
				return fmt.Errorf("enabling publisher confirms: %w", err)
			}
			returns = pub.NotifyReturn(make(chan amqp.Return, 1))
		}
		if err := r.republish(ctx, pub, returns, &d, &l); err != nil {
			return err
		}
		if r.afterConfirm != nil {
			r.afterConfirm(&l)
		}
		if err := d.Ack(false); err != nil {
			// Republished and still in the DLQ: a later redrive sends it
			// again, and the inbox absorbs the second copy.
			report(done, &l, act, false)
			return fmt.Errorf("acknowledging %q in %s after its republish was confirmed (it stays in the DLQ; the consumer's inbox absorbs a second redrive, and a second replay of it is refused as already replayed): %w", l.ID, r.cfg.Queue, err)
		}
		removed++
		report(done, &l, act, true)
	}
	return walkErr(nil)
}

// settle waits, a few seconds at most, until the queue holds at least n
// ready messages again.
func (r *RabbitMQ) settle(ctx context.Context, n int) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if d, err := r.depth(); err != nil || d >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func report(done func(*Letter, Action, bool), l *Letter, a Action, removed bool) {
	if done != nil {
		done(l, a, removed)
	}
}

// republish publishes the redrive of d and waits for the broker's confirm.
func (r *RabbitMQ) republish(ctx context.Context, pub *amqp.Channel, returns chan amqp.Return, d *amqp.Delivery, l *Letter) error {
	h := amqp.Table{}
	for k, v := range d.Headers {
		if !deadLetterHeader(k) {
			h[k] = v
		}
	}
	h[HeaderRedriven] = int64(l.Redriven + 1)
	msg := amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.ConfirmTimeout)
	defer cancel()
	c, err := pub.PublishWithDeferredConfirmWithContext(cctx, "", l.Target, true, false, msg)
	if err != nil {
		return fmt.Errorf("republishing %q to %s: %w", l.ID, l.Target, err)
	}
	ok, err := c.WaitContext(cctx)
	if err != nil {
		return fmt.Errorf("waiting for the confirm of %q: %w", l.ID, err)
	}
	// A return comes before the confirm of the same message.
	select {
	case ret := <-returns:
		return fmt.Errorf("republishing %q: the broker could not route it to queue %s (%d %s); it stays in the DLQ", l.ID, l.Target, ret.ReplyCode, ret.ReplyText)
	default:
	}
	if !ok {
		return fmt.Errorf("republishing %q: the broker nacked it; it stays in the DLQ", l.ID)
	}
	return nil
}
