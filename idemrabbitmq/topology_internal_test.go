package idemrabbitmq

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A new dead-letter queue gets an explicit unlimited delivery limit on
// RabbitMQ 4, whose quorum queues have a default limit of 20, and none on
// RabbitMQ 3, which has no default and would read -1 as a limit.
func TestDeadLetterArgs(t *testing.T) {
	for _, c := range []struct {
		props amqp.Table
		limit any
	}{
		{amqp.Table{"product": "RabbitMQ", "version": "4.0.5"}, int64(-1)},
		{amqp.Table{"product": "RabbitMQ", "version": "4.1.0-rc.1"}, int64(-1)},
		{amqp.Table{"product": "RabbitMQ", "version": "5.0.0"}, int64(-1)},
		{amqp.Table{"product": "RabbitMQ", "version": "3.13.7"}, nil},
		{amqp.Table{"product": "RabbitMQ", "version": "3.10.8"}, nil},
		{amqp.Table{"product": "RabbitMQ"}, nil},
		{amqp.Table{"product": "LavinMQ", "version": "4.0.0"}, nil},
		{nil, nil},
	} {
		args := deadLetterArgs(c.props)
		if args[amqp.QueueTypeArg] != amqp.QueueTypeQuorum || args["x-delivery-limit"] != c.limit {
			t.Errorf("server %v: dead-letter queue arguments %v, want x-delivery-limit %v", c.props, args, c.limit)
		}
	}
}
