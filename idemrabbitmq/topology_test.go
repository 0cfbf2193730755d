package idemrabbitmq_test

import (
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/idemrabbitmq"
)

// DeclareTopology declares the dead-letter queue with the arguments this
// broker (the connection's server properties) takes, and leaves one that
// exists already as it is: DeclareQuorumWithDLQ on a dead-letter queue
// declared with other arguments is refused by the broker.
func TestDeclareTopologyDeadLetterQueue(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable: %v", amqpURL(), err)
	}
	defer conn.Close()
	q := uniqueName(t)
	topo, err := idemrabbitmq.DeclareTopology(conn, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_ = idemrabbitmq.DeleteTopology(ch, topo)
		}
	})
	if topo.DeadLetterQueue != q+".dlq" {
		t.Fatalf("topology %+v", topo)
	}
	// Declared again: the same, no error.
	if _, err := idemrabbitmq.DeclareTopology(conn, q, nil); err != nil {
		t.Fatalf("declaring again: %v", err)
	}
	// The broker compares x-delivery-limit on a redeclaration: the queue
	// has -1 on RabbitMQ 4 and later, none before.
	want := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	if v, _ := conn.Properties["version"].(string); !strings.HasPrefix(v, "3.") {
		want["x-delivery-limit"] = int64(-1)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(topo.DeadLetterQueue, true, false, false, false, want); err != nil {
		t.Fatalf("the dead-letter queue has other arguments than this broker's: %v", err)
	}
	other := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-delivery-limit": int64(7)}
	var ae *amqp.Error
	if _, err := ch.QueueDeclare(topo.DeadLetterQueue, true, false, false, false, other); !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		t.Fatalf("redeclaring with a limit of 7: %v, want 406 (the broker compares the limit)", err)
	}

	// A dead-letter queue declared before with a limit of its own.
	q2 := uniqueName(t)
	if ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q2+".dlq", true, false, false, false, other); err != nil {
		t.Fatal(err)
	}
	topo2, err := idemrabbitmq.DeclareTopology(conn, q2, nil)
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_ = idemrabbitmq.DeleteTopology(ch, topo2)
		}
	})
	if err != nil {
		t.Fatalf("declaring over an existing dead-letter queue: %v", err)
	}
	if _, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, q2, nil); !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		t.Fatalf("DeclareQuorumWithDLQ over it: %v, want 406", err)
	}
}
