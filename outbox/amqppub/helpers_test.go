package amqppub_test

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"

	"github.com/idemkit/idem/internal/amqptest"
)

const fixHint = "start it with: rabbitmq-server -detached && rabbitmqctl await_startup (or run make test), or set IDEM_AMQP_URL"

// amqpURL is the test broker: see [amqptest.URL].
func amqpURL() string { return amqptest.URL() }

func dial(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable (%v); %s", err, fixHint)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// name is a queue or exchange name no other test will use.
func name(t testing.TB) string {
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	n := strings.ToLower(strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()))
	return "amqppub-" + n + "-" + hex.EncodeToString(b)
}

// queue declares a durable classic queue, deleted when the test ends.
func queue(t testing.TB, conn *amqp.Connection, args amqp.Table) string {
	t.Helper()
	q := name(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if args == nil {
		args = amqp.Table{}
	}
	args[amqp.QueueTypeArg] = amqp.QueueTypeClassic
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		t.Fatalf("declaring queue %s: %v", q, err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	return q
}

func publisher(t testing.TB, conn *amqp.Connection, cfg *amqppub.Config) *amqppub.Publisher {
	t.Helper()
	p, err := amqppub.New(conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// rec is the outbox record number seq of key for queue q on the default
// exchange, as Enqueue would have made it.
func rec(q, key string, seq int, body string) outbox.Record {
	at := time.Now().Add(-time.Duration(seq) * time.Millisecond).UTC().Truncate(time.Millisecond)
	id := idem.NewUUIDv7(at)
	tm, _ := idem.TimeFromUUIDv7(id)
	return outbox.Record{
		Seq: int64(seq), ID: id, RoutingKey: q, Key: key,
		Headers: map[string]string{"x-seq": strconv.Itoa(seq)},
		Body:    []byte(body), EventTime: tm,
	}
}

// drain takes every message in q (until it has n or the queue stays empty
// for a while) and returns them in queue order.
func drain(t testing.TB, conn *amqp.Connection, q string, n int) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ds, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []amqp.Delivery
	for len(got) < n {
		select {
		case d := <-ds:
			got = append(got, d)
		case <-time.After(2 * time.Second):
			return got
		}
	}
	// Anything beyond n would be a duplicate: look briefly.
	select {
	case d := <-ds:
		got = append(got, d)
	case <-time.After(200 * time.Millisecond):
	}
	return got
}

func describe(errs []error) string {
	var b strings.Builder
	for i, err := range errs {
		fmt.Fprintf(&b, "\n  %d: %v (refused %v)", i, err, outbox.IsRefused(err))
	}
	return b.String()
}
