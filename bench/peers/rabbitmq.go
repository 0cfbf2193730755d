package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
)

// RabbitMQ is the broker of durable quorum queues of persistent messages.
func RabbitMQ() *Broker {
	return &Broker{
		Name:    "rabbitmq",
		Prepare: prepareQueue,
		Consumers: []Consumer{
			{Key: "naive", Name: "naive batched (no guard)", Run: rabbitBatches(NaiveBatch)},
			{Key: "handrolled-msg", Name: "inbox SQL by hand, per message", Guarded: true, Run: rabbitHandOne},
			{Key: "handrolled-batch", Name: "hand-rolled batched inbox", Guarded: true, Run: rabbitBatches(HandBatch)},
			{Key: "handrolled-batch-prunable", Name: "hand-rolled batched inbox + processed_at index", Guarded: true, Run: rabbitBatches(HandBatchPrunable)},
			{Key: "watermill", Name: "Watermill router + inbox SQL in its handler", Guarded: true, Run: watermillAMQP},
			{Key: "idem-msg", Name: "idem per message (Handler)", Guarded: true, Run: rabbitIdem(false, 1)},
			{Key: "idem-batch", Name: "idem batched (HandleBatch)", Guarded: true, Run: rabbitIdem(true, 1)},
			{Key: "idem-batch-2w", Name: "idem batched, 2 workers", Guarded: true, Run: rabbitIdem(true, 2)},
		},
	}
}

// queueArgs declare every queue of the benchmark: durable and quorum, the
// production kind.
var queueArgs = amqp.Table{"x-queue-type": "quorum"}

// prepareQueue declares a fresh queue and publishes w to it with confirms.
func prepareQueue(ctx context.Context, opts *Options, run string, w *Workload) (string, func(), error) {
	conn, err := amqp.Dial(opts.AMQPURL)
	if err != nil {
		return "", nil, fmt.Errorf("connecting to RabbitMQ at %s: %w", opts.AMQPURL, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return "", nil, err
	}
	if _, err := ch.QueueDeclare(run, true, false, false, false, queueArgs); err != nil {
		return "", nil, fmt.Errorf("declaring queue %s: %w", run, err)
	}
	pub, err := idemrabbitmq.NewPublisher(conn)
	if err != nil {
		return "", nil, err
	}
	msgs := make([]amqp.Publishing, len(w.Msgs))
	for i, m := range w.Msgs {
		msgs[i] = amqp.Publishing{MessageId: m.ID, ContentType: "application/json", Body: m.Body,
			// Watermill's marshaler reads a message's UUID from this header.
			Headers: amqp.Table{"_watermill_message_uuid": m.ID}}
	}
	if err := pub.Publish(ctx, "", run, msgs...); err != nil {
		return "", nil, err
	}
	cleanup := func() {
		conn, err := amqp.Dial(opts.AMQPURL)
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(run, false, false, false)
			_, _ = ch.QueueDelete(run+".dlq", false, false, false)
		}
	}
	return run, cleanup, nil
}

// consume opens a channel on e's queue with e's prefetch.
func consume(e *Env) (*amqp.Connection, <-chan amqp.Delivery, error) {
	conn, err := amqp.Dial(e.AMQPURL)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(e.Prefetch, 0, false)
	}
	var ds <-chan amqp.Delivery
	if err == nil {
		ds, err = ch.Consume(e.Source, "", false, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ds, nil
}

// batchLinger is how long a batched consumer waits for more deliveries
// before it processes a short batch.
const batchLinger = 2 * time.Millisecond

// rabbitBatches is a hand-written batching consumer: up to e.Batch
// deliveries (fewer when none arrives for batchLinger), one call of apply,
// then one multiple ack of them all, after the commit.
func rabbitBatches(apply func(context.Context, *pgxpool.Pool, string, []Msg) error) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		conn, ds, err := consume(e)
		if err != nil {
			return err
		}
		defer conn.Close()
		batch := make([]Msg, 0, e.Batch)
		var last amqp.Delivery
		timer := time.NewTimer(time.Hour)
		for {
			batch = batch[:0]
			select {
			case <-ctx.Done():
				return nil
			case d, ok := <-ds:
				if !ok {
					return errors.New("delivery channel closed")
				}
				batch, last = append(batch, Msg{ID: d.MessageId, Body: d.Body}), d
			}
			timer.Reset(batchLinger)
		fill:
			for len(batch) < e.Batch {
				select {
				case d, ok := <-ds:
					if !ok {
						return errors.New("delivery channel closed")
					}
					batch, last = append(batch, Msg{ID: d.MessageId, Body: d.Body}), d
				case <-timer.C:
					break fill
				}
			}
			if err := apply(ctx, e.Pool, e.Consumer, batch); err != nil {
				return err
			}
			if err := last.Ack(true); err != nil {
				return err
			}
			e.Acked(len(batch))
		}
	}
}

// rabbitHandOne is the per-message consumer: the inbox SQL by hand, then
// the delivery's own ack.
func rabbitHandOne(ctx context.Context, e *Env) error {
	conn, ds, err := consume(e)
	if err != nil {
		return err
	}
	defer conn.Close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-ds:
			if !ok {
				return errors.New("delivery channel closed")
			}
			if err := HandOne(ctx, e.Pool, e.Consumer, Msg{ID: d.MessageId, Body: d.Body}); err != nil {
				return err
			}
			if err := d.Ack(false); err != nil {
				return err
			}
			e.Acked(1)
		}
	}
}

// settled counts the acks an idem consumer sent.
type settled struct{ e *Env }

func (s settled) OnSettle(_, _ string, d idem.Disposition, _ idem.Result) {
	if d.Action == idem.ActionAck {
		s.e.Acked(1)
	}
}

// rabbitIdem is idemrabbitmq with the effect through idem.JSON (batch 1)
// or idem.JSONBatch.
func rabbitIdem(batched bool, workers int) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		proc, err := Processor(e.Store, e.Consumer, batched)
		if err != nil {
			return err
		}
		batch := 1
		if batched {
			batch = e.Batch
		}
		c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: e.AMQPURL, Queue: e.Source,
			BatchSize: batch, Prefetch: e.Prefetch, Workers: workers, Hooks: []idem.Hook{settled{e}}, Logger: quiet})
		if err != nil {
			return err
		}
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
}

// rabbitVersion is the broker's version, from its connection properties.
func rabbitVersion(url string) string {
	conn, err := amqp.Dial(url)
	if err != nil {
		return ""
	}
	defer conn.Close()
	v, _ := conn.Properties["version"].(string)
	return v
}
