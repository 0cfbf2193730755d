package idemrabbitmq

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TopologyOptions tunes [DeclareTopology] and [DeclareQuorumWithDLQ]. The zero value is the
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

// DeclareTopology declares what [DeclareQuorumWithDLQ] declares, on a
// channel of its own, and gives a dead-letter queue it creates an explicit
// unlimited delivery limit where the broker has one: RabbitMQ 4 gives every
// quorum queue a delivery limit of 20 by default, and a dead-letter queue
// must never drop a letter because something read it and gave it back.
// The broker's version comes from the connection's server properties:
// RabbitMQ 4 and later get x-delivery-limit -1; RabbitMQ 3, whose quorum
// queues have no default limit (and which would read -1 as a limit), gets
// none. A dead-letter queue that exists already is left as it is (a
// redeclaration with another x-delivery-limit is refused by the broker);
// give it no limit with a policy (delivery-limit -1) on RabbitMQ 4.
func DeclareTopology(conn *amqp.Connection, queue string, opts *TopologyOptions) (Topology, error) {
	o := topologyDefaults(queue, opts)
	t := Topology{Queue: queue, DeadLetterExchange: o.DeadLetterExchange, DeadLetterQueue: o.DeadLetterQueue, DeliveryLimit: o.DeliveryLimit}
	if err := o.check(queue); err != nil {
		return t, err
	}
	// A passive declaration of a queue that does not exist closes its
	// channel: it gets one of its own.
	probe, err := conn.Channel()
	if err != nil {
		return t, fmt.Errorf("declaring topology: opening a channel: %w", err)
	}
	_, err = probe.QueueDeclarePassive(o.DeadLetterQueue, true, false, false, false, nil)
	var ae *amqp.Error
	exists := err == nil
	if err != nil && (!errors.As(err, &ae) || ae.Code != amqp.NotFound) {
		_ = probe.Close()
		return t, fmt.Errorf("declaring topology: looking for dead-letter queue %s: %w", o.DeadLetterQueue, err)
	}
	_ = probe.Close()
	ch, err := conn.Channel()
	if err != nil {
		return t, fmt.Errorf("declaring topology: opening a channel: %w", err)
	}
	defer ch.Close()
	var dlqArgs amqp.Table
	if !exists {
		dlqArgs = deadLetterArgs(conn.Properties)
	}
	return declare(ch, queue, o, t, !exists, dlqArgs)
}

// deadLetterArgs are the arguments of a dead-letter queue on the broker
// whose server properties are props: a quorum queue, with no delivery
// limit where the broker would otherwise give it one.
func deadLetterArgs(props amqp.Table) amqp.Table {
	args := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	if major, ok := brokerMajor(props); ok && major >= 4 {
		args["x-delivery-limit"] = int64(-1)
	}
	return args
}

// brokerMajor is the major version of a RabbitMQ broker from its server
// properties ("4.0.5": 4).
func brokerMajor(props amqp.Table) (int, bool) {
	if p, _ := props["product"].(string); p != "" && !strings.EqualFold(p, "RabbitMQ") {
		return 0, false
	}
	v, _ := props["version"].(string)
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	return n, err == nil
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
//
// The dead-letter queue gets no x-delivery-limit here, as before (a
// channel cannot tell the broker's version): on RabbitMQ 4 it has the
// default limit of quorum queues. idem's own reads never count against
// it (package dlq copies letters back rather than returning them), but
// [DeclareTopology] gives a new dead-letter queue an explicit unlimited one.
func DeclareQuorumWithDLQ(ch *amqp.Channel, queue string, opts *TopologyOptions) (Topology, error) {
	o := topologyDefaults(queue, opts)
	t := Topology{Queue: queue, DeadLetterExchange: o.DeadLetterExchange, DeadLetterQueue: o.DeadLetterQueue, DeliveryLimit: o.DeliveryLimit}
	if err := o.check(queue); err != nil {
		return t, err
	}
	return declare(ch, queue, o, t, true, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
}

func topologyDefaults(queue string, opts *TopologyOptions) TopologyOptions {
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
	return o
}

func (o *TopologyOptions) check(queue string) error {
	if queue == "" {
		return fmt.Errorf("declaring topology: %w: queue name is required", ErrConfig)
	}
	if o.DeliveryLimit < 1 {
		return fmt.Errorf("declaring topology: %w: delivery limit %d must be at least 1", ErrConfig, o.DeliveryLimit)
	}
	return nil
}

// declare declares the topology on ch: the dead-letter queue with dlqArgs
// when declareDLQ is set.
func declare(ch *amqp.Channel, queue string, o TopologyOptions, t Topology, declareDLQ bool, dlqArgs amqp.Table) (Topology, error) {
	if err := ch.ExchangeDeclare(t.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return t, fmt.Errorf("declaring dead-letter exchange %s: %w", t.DeadLetterExchange, err)
	}
	if declareDLQ {
		if _, err := ch.QueueDeclare(t.DeadLetterQueue, true, false, false, false, dlqArgs); err != nil {
			return t, fmt.Errorf("declaring dead-letter queue %s: %w", t.DeadLetterQueue, err)
		}
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
