package idemrabbitmq

import (
	"github.com/idemkit/idem/idembroker"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrNoDeadLetterDestination is wrapped by the error [Consumer.Run]
// returns when the dead-letter destination cannot be made sure of at
// start (a missing exchange, a queue the broker refuses to declare or
// bind): a consumer whose dead letters would be discarded does not start.
var ErrNoDeadLetterDestination = errors.New("dead letters would have nowhere to go")

// errUnroutable: the broker returned a dead letter it could route nowhere.
var errUnroutable = errors.New("dead letter unroutable")

// maxLetters bounds the dead letters of one publish, and so the returns
// the broker can send for it (the return channel must never fill up: the
// library would block the connection's reader on it).
const maxLetters = 256

// deadLetters publishes dead letters on a connection of its own. Under a
// memory or disk alarm the broker blocks every connection that publishes;
// had the dead letters gone out on the consuming connection, its acks and
// deliveries would stop with them. Here only the dead letters wait.
type deadLetters struct {
	conn     *amqp.Connection
	sock     net.Conn
	node     int // index of the node in the dead-letter connection's nodes
	ch       *amqp.Channel
	returns  chan amqp.Return
	closed   <-chan *amqp.Error // the channel or its connection closed
	exchange string
	key      string
	consumer string
	queue    string
}

// openDeadLetters connects the dead-letter connection and makes sure of the
// destination: it declares the dead-letter queue when it does not exist
// and, with a dead-letter exchange, checks the exchange exists and binds
// the queue to it, so that the route exists before the first message is
// taken. It returns an error wrapping [ErrNoDeadLetterDestination] when the
// broker refuses any of it.
func (c *Consumer[TTx]) openDeadLetters(log *slog.Logger) (*deadLetters, error) {
	cfg := &c.cfg
	conn, sock, node, err := c.dlBrokers.dial(func(url string) (*amqp.Connection, net.Conn, error) {
		return c.dial(url, cfg.ConnectionName+"-dead-letters")
	})
	if err != nil {
		return nil, fmt.Errorf("connecting the dead-letter connection: %w", err)
	}
	dl := &deadLetters{conn: conn, sock: sock, node: node, exchange: cfg.DeadLetterExchange, key: cfg.DeadLetterRoutingKey,
		consumer: c.proc.Consumer(), queue: cfg.Queue}
	fail := func(err error) (*deadLetters, error) {
		dl.close()
		return nil, err
	}
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		for b := range blocked {
			if b.Active {
				log.Warn("the broker blocked the dead-letter connection (resource alarm); dead letters wait, consumption goes on", slog.String("reason", b.Reason))
			} else {
				log.Info("the broker unblocked the dead-letter connection")
			}
		}
	}()
	q := cfg.DeadLetterQueue
	ch, err := conn.Channel()
	if err != nil {
		return fail(fmt.Errorf("opening dead-letter channel: %w", err))
	}
	if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			return fail(fmt.Errorf("%w: checking dead-letter queue %s: %w", ErrNoDeadLetterDestination, q, err))
		}
		// The 404 closed the channel.
		if ch, err = conn.Channel(); err != nil {
			return fail(fmt.Errorf("opening dead-letter channel: %w", err))
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
			return fail(fmt.Errorf("%w: declaring dead-letter queue %s: %w", ErrNoDeadLetterDestination, q, err))
		}
		log.Info("declared the dead-letter queue", slog.String("dead_letter_queue", q))
	}
	if dl.exchange == "" {
		dl.key = q
	} else {
		if err := ch.ExchangeDeclarePassive(dl.exchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
			return fail(fmt.Errorf("%w: dead-letter exchange %s: %w", ErrNoDeadLetterDestination, dl.exchange, err))
		}
		if err := ch.QueueBind(q, dl.key, dl.exchange, false, nil); err != nil {
			return fail(fmt.Errorf("%w: binding dead-letter queue %s to %s with key %s: %w", ErrNoDeadLetterDestination, q, dl.exchange, dl.key, err))
		}
	}
	if err := ch.Confirm(false); err != nil {
		return fail(fmt.Errorf("enabling publisher confirms on the dead-letter channel: %w", err))
	}
	dl.ch = ch
	dl.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	dl.returns = ch.NotifyReturn(make(chan amqp.Return, 2*maxLetters))
	return dl, nil
}

// publish publishes ls, mandatory and persistent, and waits for the
// broker's confirms. It returns nil only when every copy was confirmed and
// none was returned; then, and only then, may the originals be acked. It
// drains every return the broker sent, so none is left to fail the next
// publish.
func (d *deadLetters) publish(ctx context.Context, ls []letter) error {
	d.drain() // left over from a publish that failed early
	confirms := make([]*amqp.DeferredConfirmation, 0, len(ls))
	for i := range ls {
		c, err := d.ch.PublishWithDeferredConfirmWithContext(ctx, d.exchange, d.key, true, false, d.copyOf(&ls[i]))
		if err != nil {
			return fmt.Errorf("publishing dead letter %q: %w", ls[i].d.res.MessageID, err)
		}
		confirms = append(confirms, c)
	}
	nacked := 0
	for _, c := range confirms {
		ok, err := c.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("waiting for dead-letter confirms: %w", err)
		}
		if !ok {
			nacked++
		}
	}
	// The broker sends a return before the confirm of the same message, and
	// the library hands both over in order: every return is here by now.
	if n, r := d.drain(); n > 0 {
		return fmt.Errorf("%w: the broker returned %d of %d (exchange %q, routing key %q: %d %s)", errUnroutable, n, len(ls), d.exchange, d.key, r.ReplyCode, r.ReplyText)
	}
	if nacked > 0 {
		return fmt.Errorf("the broker nacked %d of %d dead letters", nacked, len(ls))
	}
	return nil
}

// drain empties the return channel and says how many returns it held, and
// the last.
func (d *deadLetters) drain() (n int, last amqp.Return) {
	for {
		select {
		case r := <-d.returns:
			n, last = n+1, r
		default:
			return n, last
		}
	}
}

// close closes the connection, cutting it at the socket when the broker
// does not answer (a blocked connection cannot even send its close frame).
func (d *deadLetters) close() { closeConn(d.conn, d.sock) }

// copyOf is the dead letter for one delivery: the original properties
// (but not its expiration) and headers, persistent, plus the x-idem-*
// headers.
func (d *deadLetters) copyOf(l *letter) amqp.Publishing {
	m, r := &l.delivery, l.d.res
	h := make(amqp.Table, len(m.Headers)+5)
	for k, v := range m.Headers {
		h[k] = v
	}
	idembroker.NewEnvelope(d.consumer, d.queue, r, l.d.disp).Write(
		func(k, v string) { h[k] = v },
		func(k string, n int64) { h[k] = n })
	return amqp.Publishing{
		Headers:         h,
		ContentType:     m.ContentType,
		ContentEncoding: m.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        m.Priority,
		CorrelationId:   m.CorrelationId,
		ReplyTo:         m.ReplyTo,
		MessageId:       m.MessageId,
		Timestamp:       m.Timestamp,
		Type:            m.Type,
		AppId:           m.AppId,
		Body:            m.Body,
	}
}
