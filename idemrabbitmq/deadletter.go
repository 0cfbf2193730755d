package idemrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
)

// Headers the consumer adds to a message it republishes to the dead-letter
// exchange ([Config.DeadLetterExchange]).
const (
	// HeaderReason is the error that dead-lettered the message.
	HeaderReason = "x-idem-reason"
	// HeaderOutcome is "dead_lettered" or "expired".
	HeaderOutcome = "x-idem-outcome"
	// HeaderConsumer is the consumer (processor) name.
	HeaderConsumer = "x-idem-consumer"
	// HeaderQueue is the queue the message was consumed from.
	HeaderQueue = "x-idem-queue"
	// HeaderAttempts is how many transactions the processor ran for it.
	HeaderAttempts = "x-idem-attempts"
)

// deadLetterer republishes dead letters on a confirm-mode channel of the
// session's connection, so the original is acked only once the copy is safe.
type deadLetterer struct {
	mu       sync.Mutex // one batch at a time, so returns belong to it
	ch       *amqp.Channel
	returns  chan amqp.Return
	exchange string
	key      string
	consumer string
	queue    string
}

func newDeadLetterer(conn *amqp.Connection, exchange, key, consumer, queue string) (*deadLetterer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening dead-letter channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("enabling publisher confirms on dead-letter channel: %w", err)
	}
	// Buffered beyond any batch: the library must never block handing us a
	// return.
	returns := ch.NotifyReturn(make(chan amqp.Return, 1024))
	return &deadLetterer{ch: ch, returns: returns, exchange: exchange, key: key, consumer: consumer, queue: queue}, nil
}

// errUnroutable: the dead-letter exchange routed the copy nowhere.
var errUnroutable = errors.New("dead letter unroutable: no queue is bound to the dead-letter exchange")

// republish publishes the batch's dead letters and waits for the broker's
// confirms. Once they are confirmed, their frames become Acks (the copy is
// safe, the original may go) while they are still reported as dead letters;
// on any failure they all become Requeue, frame and report, because a dead
// letter must never be dropped.
func (d *deadLetterer) republish(ctx context.Context, deliveries []amqp.Delivery, ds []decision) error {
	var idx []int
	for i := range ds {
		if ds[i].frame == DeadLetter {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	err := d.publish(ctx, deliveries, ds, idx)
	for _, i := range idx {
		if err != nil {
			ds[i].frame, ds[i].verb = Requeue, Requeue
		} else {
			ds[i].frame = Ack
		}
	}
	return err
}

func (d *deadLetterer) publish(ctx context.Context, deliveries []amqp.Delivery, ds []decision, idx []int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(idx))
	for _, i := range idx {
		c, err := d.ch.PublishWithDeferredConfirmWithContext(ctx, d.exchange, d.key, true, false, d.copyOf(&deliveries[i], ds[i].res))
		if err != nil {
			return fmt.Errorf("publishing dead letter %q: %w", ds[i].res.MessageID, err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		ok, err := c.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("waiting for dead-letter confirm: %w", err)
		}
		if !ok {
			return errors.New("broker nacked a dead letter")
		}
	}
	// The broker sends a return before the confirm of the same message, and
	// the library hands both over in order: every return is here by now.
	select {
	case r := <-d.returns:
		return fmt.Errorf("%w (exchange %q, routing key %q, reply %d %s)", errUnroutable, d.exchange, d.key, r.ReplyCode, r.ReplyText)
	default:
	}
	return nil
}

// copyOf is the dead letter for one delivery: the original properties and
// headers, persistent, plus the reason.
func (d *deadLetterer) copyOf(m *amqp.Delivery, r idem.Result) amqp.Publishing {
	h := make(amqp.Table, len(m.Headers)+5)
	for k, v := range m.Headers {
		h[k] = v
	}
	reason := r.Outcome.String()
	if r.Err != nil {
		reason = r.Err.Error()
	}
	h[HeaderReason] = reason
	h[HeaderOutcome] = r.Outcome.String()
	h[HeaderConsumer] = d.consumer
	h[HeaderQueue] = d.queue
	h[HeaderAttempts] = strconv.Itoa(r.Attempts)
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
