package dlq

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/idembroker"
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
	// DeliveryLimit is ignored: a read no longer returns letters to the
	// queue (see [RabbitMQ]), so no read counts against a delivery limit,
	// whatever the queue's is.
	//
	// Deprecated: reads are free on every queue; leave it unset.
	DeliveryLimit int
}

// ErrDeliveryLimit was returned by a read of a quorum DLQ whose letters
// were close to the queue's delivery limit.
//
// Deprecated: reads no longer count as deliveries and never refuse; it is
// not returned.
var ErrDeliveryLimit = errors.New("dead letters close to the queue's delivery limit")

// RabbitMQ is a dead-letter queue on RabbitMQ.
//
// Reading is free: AMQP has no way to look at a message without taking it,
// and a message taken and given back (rejected with requeue, or held by a
// channel that closes) counts as a delivery on a quorum queue, which drops
// it past its delivery limit (RabbitMQ 4 gives quorum queues a limit of 20
// by default). So a read takes each letter ready in the queue (basic.get),
// publishes an identical copy of it (properties, headers, body) to the
// same queue with a publisher confirm, and only then acknowledges the
// letter taken. The copy is a new message that was never delivered: no
// read, dry run or refused redrive spends a delivery, on any queue type
// and under any limit, however often it runs. A read goes once round the
// whole queue, so the letters come back in the order they had, and the
// next read finds them in that order again.
//
// A reader that dies holding a letter it has not copied yet leaves it
// unacknowledged: the broker gives it back to the queue (that counts one
// delivery). One that dies between the confirm of a copy and the
// acknowledgement of the letter leaves two copies of it: a listing shows
// it once and says so; a redrive sends both, and the consumer's inbox
// absorbs the second. Nothing is lost.
//
// A redriven letter is acknowledged only after the broker confirmed its
// republish to its target. Two reads at the same time (two programs) never
// lose or double a letter, but each may see some letter twice or miss one;
// a program that reads often, such as a web page, reads through one
// [RabbitMQ] at a time and keeps what it read for a moment.
//
// A copy does not carry the letter's user_id property (the broker refuses
// a publish whose user_id is not the reading user's), nor the broker's
// delivery counts (x-delivery-count, x-acquired-count): the copy was
// never delivered.
type RabbitMQ struct {
	cfg  RabbitMQConfig
	conn *amqp.Connection

	// afterConfirm runs between the republish's confirm and the ack of the
	// dead-letter copy (fault injection in tests).
	afterConfirm func(*Letter)
	// afterCopy runs after the confirm of the copy of a letter a read
	// keeps, before the letter is acknowledged (fault injection in tests).
	afterCopy func(n int)

	mu       sync.Mutex
	warnings []string
}

// Warnings says what the last listing found that an operator must know:
// letters the queue holds twice.
func (r *RabbitMQ) Warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.warnings)
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
		return nil, fmt.Errorf("connecting to RabbitMQ: %w", idembroker.RedactError(err, cfg.URL))
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
	e := idembroker.ReadEnvelope(m.Headers)
	l := Letter{
		ID: m.ID, DLQ: r.cfg.Queue, Position: "#" + strconv.Itoa(n),
		Reason: e.Reason, Outcome: e.Outcome, Consumer: e.Consumer,
		Attempts: e.Attempts, Origin: e.Origin, Redriven: e.Redriven,
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

// copyBatch is how many copies a read publishes before it waits for
// their confirms and acknowledges the letters they copy.
const copyBatch = 256

// Peek reads up to limit letters (0: all) without spending a delivery: it
// goes round the whole queue, copying each letter back (see [RabbitMQ]),
// and returns the first limit. A letter the queue holds twice (a read or
// redrive killed between a copy's confirm and the ack of its original) is
// returned once, with a warning.
func (r *RabbitMQ) Peek(ctx context.Context, limit int) ([]Letter, error) {
	var out []Letter
	seen := map[[sha256.Size]byte]bool{}
	twice := 0
	err := r.walk(ctx, limit, func(d *amqp.Delivery, l *Letter) (Action, error) {
		fp := fingerprint(d)
		if seen[fp] {
			twice++
			return Keep, nil
		}
		seen[fp] = true
		out = append(out, *l)
		return Keep, nil
	}, nil)
	r.mu.Lock()
	r.warnings = nil
	if twice > 0 {
		r.warnings = append(r.warnings, fmt.Sprintf("%d letters of %s are in the queue twice, identical (a read or redrive was stopped between the confirm of a copy and the acknowledgement of the letter it copies): each is listed once; a redrive sends both, and the consumer's inbox absorbs the second; a purge removes both", twice, r.cfg.Queue))
	}
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Walk hands the first limit letters (0: all) to decide, in order, and
// goes on round the whole queue. A Send is republished (mandatory,
// persistent, with a publisher confirm) to the default exchange with the
// target queue as routing key, and acknowledged in the DLQ once
// confirmed; a Drop is acknowledged; a Keep, and every letter past limit,
// is copied back to the queue (see [RabbitMQ]), so that what stays keeps
// its order and no delivery is spent. A decide error, or a republish
// that failed, stops the decisions, not the round: that letter and those
// after it are copied back as they are.
func (r *RabbitMQ) Walk(ctx context.Context, limit int, decide func(*Letter) (Action, error), done func(*Letter, Action, bool)) error {
	return r.walk(ctx, limit, func(_ *amqp.Delivery, l *Letter) (Action, error) { return decide(l) }, done)
}

// kept is a letter whose copy was published and not yet confirmed.
type kept struct {
	d *amqp.Delivery
	c *amqp.DeferredConfirmation
	n int
}

// walk is Walk with each letter's delivery handed to decide too: one
// round of the queue's first n letters (its depth when the round starts),
// each taken once and settled once (acknowledged after its copy or
// republish is confirmed, or left unacknowledged for the broker to give
// back), in order. After a decide error or a failed republish no letter
// is decided on: the rest are copied back as they are.
func (r *RabbitMQ) walk(ctx context.Context, limit int, decide func(*amqp.Delivery, *Letter) (Action, error), done func(*Letter, Action, bool)) error {
	// The letters there are now: the copies go behind them, and a round
	// ends before it reaches them.
	n, err := r.depth()
	if err != nil || n == 0 {
		return err
	}
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel: %w", err)
	}
	// Closing the channel gives back a letter taken and not yet settled
	// (after an error only).
	defer ch.Close()
	rd, err := r.newRound(ctx)
	if err != nil {
		return err
	}
	defer rd.pub.Close()
	var decideErr error
	for i := 1; i <= n; i++ {
		if err := ctx.Err(); err != nil {
			return errors.Join(err, rd.flush())
		}
		d, ok, err := ch.Get(r.cfg.Queue, false)
		if err != nil {
			return errors.Join(fmt.Errorf("reading %s: %w", r.cfg.Queue, err), rd.flush())
		}
		if !ok {
			// Fewer than counted: another reader holds the rest.
			break
		}
		act := Keep
		var l Letter
		if decideErr == nil && (limit <= 0 || i <= limit) {
			l = r.letter(&d, i)
			if act, decideErr = decide(&d, &l); decideErr != nil {
				act = Keep
			}
		}
		sendErr, err := rd.settle(&d, &l, i, act, done)
		if err != nil {
			return err
		}
		if sendErr != nil {
			decideErr = sendErr
		}
	}
	if err := rd.flush(); err != nil {
		return errors.Join(decideErr, err)
	}
	return decideErr
}

// round is the publishing side of one walk: a confirming channel, its
// returns, and the copies in flight whose letters are not yet
// acknowledged.
type round struct {
	r       *RabbitMQ
	ctx     context.Context
	pub     *amqp.Channel
	returns chan amqp.Return
	pending []kept
}

// newRound opens the publishing channel of a walk, in confirm mode.
func (r *RabbitMQ) newRound(ctx context.Context) (*round, error) {
	pub, err := r.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening the publishing channel: %w", err)
	}
	if err := pub.Confirm(false); err != nil {
		pub.Close()
		return nil, fmt.Errorf("enabling publisher confirms: %w", err)
	}
	// Room for a return of every copy in flight: the library blocks its
	// reader on a full channel, and the confirms come behind the returns.
	returns := pub.NotifyReturn(make(chan amqp.Return, copyBatch+1))
	return &round{r: r, ctx: ctx, pub: pub, returns: returns}, nil
}

// flush waits for the confirms of the copies in flight, and acknowledges
// each letter whose copy the queue holds; at the first failure, that
// letter and those after it stay unacknowledged, for the broker to give
// back when the channel closes. Nothing is in flight after it.
func (rd *round) flush() error {
	r := rd.r
	defer func() { rd.pending = rd.pending[:0] }()
	for _, k := range rd.pending {
		// Waited for even when ctx ends: a copy the broker took
		// without its letter acknowledged is a letter held twice.
		if err := r.confirmed(context.WithoutCancel(rd.ctx), k.c, rd.returns, r.cfg.Queue); err != nil {
			return fmt.Errorf("copying letter #%d back to %s (it stays): %w", k.n, r.cfg.Queue, err)
		}
		if r.afterCopy != nil {
			r.afterCopy(k.n)
		}
		if err := k.d.Ack(false); err != nil {
			return fmt.Errorf("acknowledging letter #%d of %s after its copy was confirmed (both stay: a listing shows it once): %w", k.n, r.cfg.Queue, err)
		}
	}
	return nil
}

// keep copies letter i back behind the others; its acknowledgement waits
// for the copy's confirm, at most copyBatch copies at a time.
func (rd *round) keep(d *amqp.Delivery, i int) error {
	r := rd.r
	// Not cancelled with ctx: the letter is held, and a copy spends
	// no delivery where giving it back would.
	c, err := rd.pub.PublishWithDeferredConfirmWithContext(context.WithoutCancel(rd.ctx), "", r.cfg.Queue, true, false, copyOf(d))
	if err != nil {
		return errors.Join(fmt.Errorf("copying letter #%d back to %s (it stays): %w", i, r.cfg.Queue, err), rd.flush())
	}
	rd.pending = append(rd.pending, kept{d: d, c: c, n: i})
	if len(rd.pending) >= copyBatch {
		return rd.flush()
	}
	return nil
}

// settle carries out act on letter i: Keep copies it back, Drop
// acknowledges it, Send republishes it. sendErr is a republish that
// failed, the letter kept: it stops the decisions, not the round; err
// ends the round.
func (rd *round) settle(d *amqp.Delivery, l *Letter, i int, act Action, done func(*Letter, Action, bool)) (sendErr, err error) {
	switch act {
	case Keep:
		return nil, rd.keep(d, i)
	case Drop:
		if err := d.Ack(false); err != nil {
			return nil, errors.Join(fmt.Errorf("acknowledging %q in %s (it stays): %w", l.ID, rd.r.cfg.Queue, err), rd.flush())
		}
		report(done, l, act, true)
		return nil, nil
	}
	return rd.send(d, l, i, act, done)
}

// send republishes letter i to its target and acknowledges it in the DLQ
// once the republish is confirmed. A letter not sent (or not known to be)
// stays, copied back in its place in the round, and sendErr says why.
func (rd *round) send(d *amqp.Delivery, l *Letter, i int, act Action, done func(*Letter, Action, bool)) (sendErr, err error) {
	r := rd.r
	// A return read after the confirm of a republish must be its own:
	// the copies in flight are settled first.
	if err := rd.flush(); err != nil {
		return nil, err
	}
	if l.Target == "" {
		sendErr = fmt.Errorf("letter %q names no origin queue to redrive to", l.ID)
	} else {
		sendErr = r.republish(rd.ctx, rd.pub, rd.returns, d, l)
	}
	if sendErr != nil {
		if err := rd.keep(d, i); err != nil {
			return sendErr, errors.Join(sendErr, err)
		}
		return sendErr, nil
	}
	if r.afterConfirm != nil {
		r.afterConfirm(l)
	}
	if err := d.Ack(false); err != nil {
		// Republished and still in the DLQ: a later redrive sends it
		// again, and the inbox absorbs the second copy.
		report(done, l, act, false)
		return nil, fmt.Errorf("acknowledging %q in %s after its republish was confirmed (it stays in the DLQ; the consumer's inbox absorbs a second redrive, and a second replay of it is refused as already replayed): %w", l.ID, r.cfg.Queue, err)
	}
	report(done, l, act, true)
	return nil, nil
}

// copyOf is the copy of a letter a read puts back: the same properties,
// headers and body, without the broker's delivery counts and user_id.
func copyOf(d *amqp.Delivery) amqp.Publishing {
	var h amqp.Table
	if d.Headers != nil {
		h = make(amqp.Table, len(d.Headers))
		for k, v := range d.Headers {
			if !deliveryAnnotation(k) {
				h[k] = v
			}
		}
	}
	return amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	}
}

// deliveryAnnotation reports whether a header is one the broker sets on a
// delivery rather than one the letter carries.
func deliveryAnnotation(k string) bool {
	return k == "x-delivery-count" || k == "x-acquired-count"
}

// fingerprint identifies a letter by everything a copy keeps: a letter
// and its copy have the same.
func fingerprint(d *amqp.Delivery) [sha256.Size]byte {
	p := copyOf(d)
	h := sha256.New()
	keys := make([]string, 0, len(p.Headers))
	for k := range p.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Fprintf(h, "%q %q %d %d %q %q %q %q %d %q %q %d\n", p.ContentType, p.ContentEncoding, p.DeliveryMode, p.Priority,
		p.CorrelationId, p.ReplyTo, p.Expiration, p.MessageId, p.Timestamp.UnixNano(), p.Type, p.AppId, len(keys))
	for _, k := range keys {
		// fmt prints maps with their keys sorted.
		fmt.Fprintf(h, "%q %T %v\n", k, p.Headers[k], p.Headers[k])
	}
	h.Write(p.Body)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// confirmed waits for the confirm of one publish to queue and checks it
// was neither returned nor nacked.
func (r *RabbitMQ) confirmed(ctx context.Context, c *amqp.DeferredConfirmation, returns chan amqp.Return, queue string) error {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.ConfirmTimeout)
	defer cancel()
	ok, err := c.WaitContext(cctx)
	if err != nil {
		return fmt.Errorf("waiting for the confirm: %w", err)
	}
	// A return comes before the confirm of the same message.
	select {
	case ret := <-returns:
		return fmt.Errorf("the broker could not route it to queue %s (%d %s)", queue, ret.ReplyCode, ret.ReplyText)
	default:
	}
	if !ok {
		return errors.New("the broker nacked it")
	}
	return nil
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
	h[idembroker.HeaderRedriven] = int64(l.Redriven + 1)
	msg := amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	}
	c, err := pub.PublishWithDeferredConfirmWithContext(ctx, "", l.Target, true, false, msg)
	if err != nil {
		return fmt.Errorf("republishing %q to %s: %w", l.ID, l.Target, err)
	}
	if err := r.confirmed(ctx, c, returns, l.Target); err != nil {
		return fmt.Errorf("republishing %q: %w; it stays in the DLQ", l.ID, err)
	}
	return nil
}
