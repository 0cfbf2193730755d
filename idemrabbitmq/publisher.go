package idemrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Publisher publishes with publisher confirms: Publish returns only once the
// broker has taken responsibility for every message (persisted it, for a
// durable queue), and refuses a message without message_id, the identity
// the consumer dedupes by. It is a helper for tests, demos and simple
// producers; a service that writes to its database and publishes should
// use a transactional outbox instead. A Publisher is safe for concurrent
// use; calls are serialized.
type Publisher struct {
	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
}

// ErrUnroutable is returned when the broker routed a mandatory message to
// no queue.
var ErrUnroutable = errors.New("message unroutable")

// ErrNoMessageID is returned by [Publisher.Publish] for a message without
// message_id.
var ErrNoMessageID = errors.New("publishing without message_id")

// NewPublisher opens a channel on conn in confirm mode. Close the publisher
// (or the connection) when done.
func NewPublisher(conn *amqp.Connection) (*Publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enabling publisher confirms: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	return &Publisher{ch: ch, returns: returns}, nil
}

// publishWindow bounds the messages awaiting a confirm, so a large call
// neither floods the broker nor holds every confirmation in memory.
const publishWindow = 1000

// Publish publishes msgs to exchange with routing key, mandatory and
// persistent (DeliveryMode is forced to [amqp.Persistent]), and waits for the
// broker's confirms. It returns an error wrapping [ErrNoMessageID] before
// publishing anything if a message lacks message_id, [ErrUnroutable] if the
// broker routed one nowhere, and an error for a broker nack. After an error,
// any subset of msgs may have been published; publishing them again is
// safe for an idem consumer, which is the point.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msgs ...amqp.Publishing) error {
	for i := range msgs {
		if msgs[i].MessageId == "" {
			return fmt.Errorf("%w (message %d)", ErrNoMessageID, i)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drainReturns() // left over from a call that failed early
	pending := make([]*amqp.DeferredConfirmation, 0, min(len(msgs), publishWindow))
	wait := func() error {
		for _, c := range pending {
			ok, err := c.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("waiting for publisher confirm: %w", err)
			}
			if !ok {
				return errors.New("broker nacked a published message")
			}
		}
		pending = pending[:0]
		// A return precedes the confirm of its message: it is here by now.
		select {
		case r := <-p.returns:
			return fmt.Errorf("%w: message %q to exchange %q, routing key %q: %d %s", ErrUnroutable, r.MessageId, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
		default:
		}
		return nil
	}
	for _, m := range msgs {
		m.DeliveryMode = amqp.Persistent
		c, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, m)
		if err != nil {
			return fmt.Errorf("publishing message %q: %w", m.MessageId, err)
		}
		pending = append(pending, c)
		if len(pending) == publishWindow {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return wait()
}

func (p *Publisher) drainReturns() {
	for {
		select {
		case <-p.returns:
		default:
			return
		}
	}
}

// Close closes the publisher's channel.
func (p *Publisher) Close() error {
	if err := p.ch.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("closing publisher channel: %w", err)
	}
	return nil
}
