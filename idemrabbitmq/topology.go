package idemrabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TopologyOptions tunes [DeclareQuorumWithDLQ]. The zero value is the
// recommended setup.
type TopologyOptions struct {
	// DeliveryLimit is how many times the broker delivers a message that
	// keeps coming back (requeued, or held by a consumer that crashed)
	// before it dead-letters it. Defaults to 20. This is what ends a message
	// that crashes the process before the consumer can decide anything.
	DeliveryLimit int
	// DeadLetterExchange defaults to "<queue>.dlx"; DeadLetterQueue to
	// "<queue>.dlq".
	DeadLetterExchange, DeadLetterQueue string
	// AtMostOnceDeadLettering drops RabbitMQ's at-least-once dead-lettering
	// (on by default here), which needs x-overflow=reject-publish; set it only
	// when the queue must use another overflow behaviour.
	AtMostOnceDeadLettering bool
}

// Topology names what [DeclareQuorumWithDLQ] declared.
type Topology struct {
	// Queue is the work queue: durable, quorum, dead-lettering to
	// DeadLetterExchange with routing key Queue.
	Queue string
	// DeadLetterExchange is a durable direct exchange: the queue's own
	// dead-letter route, for messages the broker dead-letters at the
	// delivery limit. The consumer publishes its dead letters straight to
	// DeadLetterQueue unless [Config.DeadLetterExchange] names this.
	DeadLetterExchange string
	// DeadLetterQueue is a durable quorum queue bound to DeadLetterExchange
	// with routing key Queue. It is "<queue>.dlq" unless the options named
	// another; pass another as [Config.DeadLetterQueue].
	DeadLetterQueue string
	// DeliveryLimit is the queue's x-delivery-limit.
	DeliveryLimit int
}

// DeclareQuorumWithDLQ declares a durable quorum queue whose messages end in
// a dead-letter queue rather than being lost or looping forever: the queue
// gets x-dead-letter-exchange, x-dead-letter-routing-key and
// x-delivery-limit, and, unless opts says otherwise, at-least-once
// dead-lettering (x-dead-letter-strategy=at-least-once with
// x-overflow=reject-publish), so the broker keeps a dead letter until the
// dead-letter queue confirmed it. The declarations are idempotent with the
// same options; RabbitMQ refuses (406, closing ch) a redeclaration with other
// arguments. opts may be nil.
func DeclareQuorumWithDLQ(ch *amqp.Channel, queue string, opts *TopologyOptions) (Topology, error) {
	var o TopologyOptions
	if opts != nil {
		o = *opts
	}
	if o.DeliveryLimit == 0 {
		o.DeliveryLimit = 20
	}
	if o.DeadLetterExchange == "" {
		o.DeadLetterExchange = queue + ".dlx"
	}
	if o.DeadLetterQueue == "" {
		o.DeadLetterQueue = queue + ".dlq"
	}
	t := Topology{Queue: queue, DeadLetterExchange: o.DeadLetterExchange, DeadLetterQueue: o.DeadLetterQueue, DeliveryLimit: o.DeliveryLimit}
	if queue == "" {
		return t, fmt.Errorf("declaring topology: %w: queue name is required", ErrConfig)
	}
	if o.DeliveryLimit < 1 {
		return t, fmt.Errorf("declaring topology: %w: delivery limit %d must be at least 1", ErrConfig, o.DeliveryLimit)
	}
	if err := ch.ExchangeDeclare(t.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return t, fmt.Errorf("declaring dead-letter exchange %s: %w", t.DeadLetterExchange, err)
	}
	if _, err := ch.QueueDeclare(t.DeadLetterQueue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		return t, fmt.Errorf("declaring dead-letter queue %s: %w", t.DeadLetterQueue, err)
	}
	if err := ch.QueueBind(t.DeadLetterQueue, queue, t.DeadLetterExchange, false, nil); err != nil {
		return t, fmt.Errorf("binding dead-letter queue %s: %w", t.DeadLetterQueue, err)
	}
	args := amqp.Table{
		amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
		"x-dead-letter-exchange":    t.DeadLetterExchange,
		"x-dead-letter-routing-key": queue,
		"x-delivery-limit":          int64(o.DeliveryLimit),
	}
	if !o.AtMostOnceDeadLettering {
		args["x-dead-letter-strategy"] = "at-least-once"
		args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		return t, fmt.Errorf("declaring queue %s: %w", queue, err)
	}
	return t, nil
}

// DeleteTopology deletes what [DeclareQuorumWithDLQ] declared, messages
// included; for tests and teardown scripts.
func DeleteTopology(ch *amqp.Channel, t Topology) error {
	if _, err := ch.QueueDelete(t.Queue, false, false, false); err != nil {
		return fmt.Errorf("deleting queue %s: %w", t.Queue, err)
	}
	if _, err := ch.QueueDelete(t.DeadLetterQueue, false, false, false); err != nil {
		return fmt.Errorf("deleting queue %s: %w", t.DeadLetterQueue, err)
	}
	if err := ch.ExchangeDelete(t.DeadLetterExchange, false, false); err != nil {
		return fmt.Errorf("deleting exchange %s: %w", t.DeadLetterExchange, err)
	}
	return nil
}
