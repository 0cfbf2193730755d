package amqppub

import (
	"github.com/idemkit/idem/idembroker"

	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/outbox"
)

// DefaultMaxBodyBytes is RabbitMQ's default max_message_size before 4.0
// (4.0 lowered it to 16 MiB).
const DefaultMaxBodyBytes = 128 << 20

// Config configures a [Publisher]. The zero value is the default.
type Config struct {
	// Redial dials a new connection when the publisher's has closed; the
	// publisher then owns it and closes it on Close. Optional: without it
	// a closed connection fails every call as an outage.
	Redial func(ctx context.Context) (*amqp.Connection, error)
	// MaxBodyBytes refuses a record whose body is larger, before it is
	// published: the broker would close the channel on it, failing its
	// neighbours with it and the record itself on every retry. Set it to
	// the broker's max_message_size. Defaults to [DefaultMaxBodyBytes].
	MaxBodyBytes int
	// Window bounds the messages awaiting a confirm at once (and so the
	// returns the broker can send for them). Defaults to 1000.
	Window int
	// TimeHeader is the header carrying the event time. Defaults to
	// idembroker.HeaderEventTime ("x-event-time").
	TimeHeader string
}

// Publisher publishes outbox records to RabbitMQ with confirms. It
// implements [outbox.Publisher]; it is used by one goroutine at a time.
type Publisher struct {
	cfg       Config
	conn      *amqp.Connection
	owned     bool // conn was dialed by Redial
	ch        *amqp.Channel
	returns   chan amqp.Return
	closed    chan *amqp.Error
	exchanges map[string]bool // exchanges known to exist, on this channel's watch
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a publisher on conn, with a channel of its own in confirm
// mode. cfg may be nil. Close closes the channel, and a connection the
// publisher dialed; conn stays the caller's.
func New(conn *amqp.Connection, cfg *Config) (*Publisher, error) {
	if conn == nil {
		return nil, errors.New("amqppub: the connection is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Window <= 0 {
		c.Window = 1000
	}
	if c.TimeHeader == "" {
		c.TimeHeader = idembroker.HeaderEventTime
	}
	p := &Publisher{cfg: c, conn: conn}
	if err := p.open(context.Background()); err != nil {
		return nil, err
	}
	return p, nil
}

// open makes sure of a live channel in confirm mode, dialing again when the
// connection closed and Redial is set.
func (p *Publisher) open(ctx context.Context) error {
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	p.ch, p.exchanges = nil, nil
	if p.conn.IsClosed() {
		if p.cfg.Redial == nil {
			return errors.New("opening the publishing channel: the connection is closed (set amqppub.Config.Redial to dial again)")
		}
		conn, err := p.cfg.Redial(ctx)
		if err != nil {
			return fmt.Errorf("dialing RabbitMQ again: %w", err)
		}
		if p.owned {
			_ = p.conn.Close()
		}
		p.conn, p.owned = conn, true
	}
	ch, err := channel(ctx, p.conn, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return fmt.Errorf("enabling publisher confirms: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("opening the publishing channel: %w", err)
	}
	p.ch = ch
	p.returns = ch.NotifyReturn(make(chan amqp.Return, p.cfg.Window))
	p.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	p.exchanges = make(map[string]bool)
	return nil
}

// Close closes the publisher's channel, and its connection if it dialed it.
func (p *Publisher) Close() error {
	var errs []error
	if p.ch != nil {
		if err := p.ch.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, fmt.Errorf("closing the publishing channel: %w", err))
		}
	}
	if p.owned {
		if err := p.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, fmt.Errorf("closing the connection: %w", err))
		}
	}
	return errors.Join(errs...)
}

// call is the state of one Publish: each key's records not yet settled,
// in order.
type call struct {
	recs  []outbox.Record
	errs  []error
	queue map[string][]int // per key, the indices still to publish
	keys  []string         // keys in order of first appearance
}

// fail settles recs[i] with err and every later record of its key with
// ErrNotAttempted.
func (c *call) fail(i int, err error) {
	c.errs[i] = err
	k := c.recs[i].Key
	for _, j := range c.queue[k] {
		if j != i {
			c.errs[j] = outbox.ErrNotAttempted
		}
	}
	c.queue[k] = nil
}

// failAll settles every unsettled record after an outage: the first of each
// key with err, the later ones with ErrNotAttempted.
func (c *call) failAll(err error) {
	for _, k := range c.keys {
		if q := c.queue[k]; len(q) > 0 {
			c.fail(q[0], err)
		}
	}
}

// Publish publishes recs and returns, per record, nil once the broker
// confirmed it without returning it, an error for which outbox.IsRefused
// is true when the record itself was refused, [outbox.ErrNotAttempted] for
// a record not published because an earlier one of its key failed, or
// another error for an outage (or for ctx done before the confirm).
func (p *Publisher) Publish(ctx context.Context, recs []outbox.Record) []error {
	c := &call{recs: recs, errs: make([]error, len(recs)), queue: make(map[string][]int)}
	for i := range recs {
		k := recs[i].Key
		if _, ok := c.queue[k]; !ok {
			c.keys = append(c.keys, k)
		}
		c.queue[k] = append(c.queue[k], i)
	}
	if err := p.open(ctx); err != nil {
		c.failAll(err)
		return c.errs
	}
	for {
		wave := p.wave(ctx, c)
		if len(wave) == 0 {
			return c.errs
		}
		if err := p.publish(ctx, c, wave); err != nil {
			c.failAll(err)
			return c.errs
		}
	}
}

// wave takes the next record of every key that has one, up to the window,
// settling at once those refused before publishing.
func (p *Publisher) wave(ctx context.Context, c *call) []int {
	var wave []int
	for _, k := range c.keys {
		for len(c.queue[k]) > 0 && len(wave) < p.cfg.Window {
			i := c.queue[k][0]
			if err := p.check(ctx, &c.recs[i]); err != nil {
				c.fail(i, err)
				continue
			}
			wave = append(wave, i)
			break
		}
	}
	sort.Ints(wave)
	return wave
}

// check refuses a record the broker would refuse in a way that closes the
// channel: a body over the limit, an exchange that does not exist. Only a
// refusal is returned; an exchange that cannot be checked is left to the
// publish.
func (p *Publisher) check(ctx context.Context, r *outbox.Record) error {
	if len(r.Body) > p.cfg.MaxBodyBytes {
		return outbox.Refused(fmt.Errorf("publishing %s: the body is %d bytes, more than the broker takes (amqppub.Config.MaxBodyBytes %d)", r.ID, len(r.Body), p.cfg.MaxBodyBytes))
	}
	ex := r.Destination
	if ex == "" || p.exchanges[ex] {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return nil
	}
	var declared error
	ch, err := channel(ctx, p.conn, func(ch *amqp.Channel) error {
		declared = ch.ExchangeDeclarePassive(ex, amqp.ExchangeDirect, true, false, false, false, nil)
		return nil
	})
	if err != nil {
		return nil
	}
	go func() { _ = ch.Close() }() // a 404 closed it already
	var ae *amqp.Error
	switch {
	case declared == nil:
		p.exchanges[ex] = true
	case errors.As(declared, &ae) && ae.Code == amqp.NotFound:
		// The 404 closed the scratch channel; the publishing one is
		// untouched.
		return outbox.Refused(fmt.Errorf("publishing %s: exchange %q does not exist: %w", r.ID, ex, declared))
	}
	return nil
}

// channel opens a channel on conn and runs setup on it, giving up when ctx
// ends first: amqp091-go waits for the broker's answer with no deadline, and
// a broker that went silent never sends one. A channel that opens after ctx
// ended is closed.
func channel(ctx context.Context, conn *amqp.Connection, setup func(*amqp.Channel) error) (*amqp.Channel, error) {
	type opened struct {
		ch  *amqp.Channel
		err error
	}
	done := make(chan opened, 1)
	go func() {
		ch, err := conn.Channel()
		if err == nil {
			if err = setup(ch); err != nil {
				_ = ch.Close()
				ch = nil
			}
		}
		done <- opened{ch, err}
	}()
	select {
	case o := <-done:
		return o.ch, o.err
	case <-ctx.Done():
		go func() {
			if o := <-done; o.ch != nil {
				_ = o.ch.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// publish publishes the records of one wave and waits for their confirms.
// It settles every record it can; a non-nil error is an outage that ends
// the call (the records it names no fate for are settled by the caller).
func (p *Publisher) publish(ctx context.Context, c *call, wave []int) error {
	ch := p.ch
	p.drainReturns()
	wave0 := wave
	confirms := make([]*amqp.DeferredConfirmation, 0, len(wave))
	for _, i := range wave {
		r := &c.recs[i]
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, r.Destination, r.RoutingKey, true, false, p.message(r))
		if err != nil {
			p.abandon()
			c.fail(i, fmt.Errorf("publishing %s to exchange %q: %w", r.ID, r.Destination, err))
			return fmt.Errorf("publishing to RabbitMQ: a publish on the channel failed: %w", err)
		}
		confirms = append(confirms, dc)
	}
	waited := len(confirms)
	for j, dc := range confirms {
		select {
		case <-dc.Done():
			continue
		case <-ctx.Done():
		}
		waited = j
		break
	}
	// A return comes before the confirm of its message: every return of
	// the confirms waited for is in the channel by now.
	returned := make(map[string]amqp.Return)
	for drained := false; !drained; {
		select {
		case ret, ok := <-p.returns:
			if !ok { // the channel closed
				drained = true
				break
			}
			returned[ret.MessageId] = ret
		default:
			drained = true
		}
	}
	if waited < len(confirms) {
		// Later confirms and returns of this channel would mix with
		// the next call's: that one starts on a fresh channel.
		p.abandon()
		for _, i := range wave[waited:] {
			c.fail(i, fmt.Errorf("waiting for the broker to confirm %s: %w", c.recs[i].ID, ctx.Err()))
		}
		confirms, wave = confirms[:waited], wave[:waited]
	}
	var closedErr error
	for j, dc := range confirms {
		i := wave[j]
		r := &c.recs[i]
		if ret, ok := returned[r.ID]; ok {
			c.fail(i, outbox.Refused(fmt.Errorf("publishing %s to exchange %q with routing key %q: %w: %d %s",
				r.ID, r.Destination, r.RoutingKey, idemrabbitmq.ErrUnroutable, ret.ReplyCode, ret.ReplyText)))
			continue
		}
		if dc.Acked() {
			c.errs[i] = nil
			c.queue[r.Key] = c.queue[r.Key][1:]
			continue
		}
		if ch.IsClosed() {
			if closedErr == nil {
				closedErr = p.closeReason()
			}
			c.fail(i, fmt.Errorf("publishing %s to exchange %q: the channel closed before the broker confirmed it: %w", r.ID, r.Destination, closedErr))
			continue
		}
		c.fail(i, fmt.Errorf("publishing %s to exchange %q with routing key %q: the broker nacked it", r.ID, r.Destination, r.RoutingKey))
	}
	switch {
	case closedErr != nil:
		return fmt.Errorf("publishing to RabbitMQ: %w", closedErr)
	case waited < len(wave0):
		return fmt.Errorf("waiting for publisher confirms: %w", ctx.Err())
	}
	return nil
}

// closeReason is why the publishing channel closed.
func (p *Publisher) closeReason() error {
	select {
	case e, ok := <-p.closed:
		if ok && e != nil {
			return e
		}
	default:
	}
	return amqp.ErrClosed
}

// abandon drops the publishing channel so that the next call opens a
// fresh one. It is closed in the background: closing waits for the
// broker's answer, which a broker that went silent never sends.
func (p *Publisher) abandon() {
	if ch := p.ch; ch != nil {
		p.ch = nil
		go func() { _ = ch.Close() }()
	}
}

func (p *Publisher) drainReturns() {
	for {
		select {
		case _, ok := <-p.returns:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// message builds the AMQP message of r.
func (p *Publisher) message(r *outbox.Record) amqp.Publishing {
	h := make(amqp.Table, len(r.Headers)+1)
	for k, v := range r.Headers {
		h[k] = v
	}
	m := amqp.Publishing{
		MessageId:    r.ID,
		DeliveryMode: amqp.Persistent,
		Body:         r.Body,
		Headers:      h,
	}
	if !r.EventTime.IsZero() {
		m.Timestamp = r.EventTime
		h[p.cfg.TimeHeader] = r.EventTime.UTC().Format(time.RFC3339Nano)
	}
	return m
}
