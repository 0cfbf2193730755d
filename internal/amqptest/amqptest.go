// Package amqptest connects tests to the RabbitMQ broker named by
// IDEM_AMQP_URL (default: guest on 127.0.0.1:5672) and gives each test
// queues of its own, deleted when the test ends, so that packages and tests
// run in parallel without seeing each other's messages.
package amqptest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultURL is used when IDEM_AMQP_URL is unset.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// FixHint says how to bring the test broker up, for a test's failure
// message.
const FixHint = "start it with: rabbitmq-server -detached && rabbitmqctl await_startup (or run make test), or set IDEM_AMQP_URL"

// URL is the test broker's URL: IDEM_AMQP_URL, else DefaultURL.
func URL() string {
	if u := os.Getenv("IDEM_AMQP_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Dial connects to the test broker, failing t with FixHint when it is not
// reachable, and closes the connection when t ends.
func Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(URL(), amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable (%v); %s", err, FixHint)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

// Name is a queue or exchange name for t that no other test, in this or a
// concurrent run, uses: the test's name, made safe and cut to 40
// characters, and a random suffix.
func Name(t testing.TB) string {
	n := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "idem-test-" + n + "-" + hex.EncodeToString(b[:])
}

// Queue declares a durable queue of its own for t, with args (nil for a
// classic queue; amqp.Table{"x-queue-type": "quorum"} for a quorum queue),
// and deletes it when t ends. It returns the queue's name.
func Queue(t testing.TB, conn *amqp.Connection, args amqp.Table) string {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("opening a channel: %v", err)
	}
	defer ch.Close()
	name := Name(t)
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declaring queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		// The test's connection may be closed by then: a connection of
		// its own deletes the queue.
		c, err := amqp.Dial(URL())
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.Close()
		}
	})
	return name
}
