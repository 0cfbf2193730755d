package outbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Message is one event to publish once the caller's transaction commits.
type Message struct {
	// Destination is the Kafka topic, or the RabbitMQ exchange. Required;
	// for RabbitMQ's default exchange, whose name is empty, set
	// DefaultExchange instead.
	Destination string
	// DefaultExchange publishes to RabbitMQ's default exchange (whose name
	// is ""): RoutingKey then names the queue. Destination must be empty.
	DefaultExchange bool
	// RoutingKey is the RabbitMQ routing key; Kafka ignores it.
	RoutingKey string
	// Key orders messages: the relay publishes messages with the same key
	// in commit order (and Kafka publishers use it as the record key, so
	// they land on one partition). Messages with an empty key carry no
	// order among themselves.
	Key string
	// Headers are passed to the broker as they are. Names must be
	// non-empty printable ASCII; the publishers set the ID and event-time
	// headers themselves.
	Headers map[string]string
	// Body is the payload, at most Config.MaxBody bytes.
	Body []byte
}

// ErrInvalid is the error of a message Enqueue refuses; the message says why.
var ErrInvalid = errors.New("outbox: invalid message")

// maxName bounds destinations, routing keys, keys and header names: every
// broker refuses longer ones (AMQP short strings are 255 bytes).
const maxName = 255

// validate checks m as message i of an Enqueue call.
func (m *Message) validate(i, maxBody int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %d: %s", ErrInvalid, i, fmt.Sprintf(format, args...))
	}
	switch {
	case m.Destination == "" && !m.DefaultExchange:
		return bad("destination is empty (a Kafka topic or a RabbitMQ exchange; set DefaultExchange for RabbitMQ's default exchange)")
	case m.Destination != "" && m.DefaultExchange:
		return bad("destination %q is set together with DefaultExchange", m.Destination)
	case m.DefaultExchange && m.RoutingKey == "":
		return bad("the default exchange needs a routing key (the queue's name)")
	case len(m.Body) > maxBody:
		return bad("body of %d bytes exceeds the limit of %d (Config.MaxBody)", len(m.Body), maxBody)
	}
	for what, v := range map[string]string{"destination": m.Destination, "routing key": m.RoutingKey, "key": m.Key} {
		if len(v) > maxName || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return bad("%s must be valid UTF-8 without NUL, at most %d bytes", what, maxName)
		}
	}
	for k, v := range m.Headers {
		if k == "" || len(k) > maxName {
			return bad("header name %q must be 1 to %d bytes", k, maxName)
		}
		for _, r := range k {
			if r <= ' ' || r > '~' {
				return bad("header name %q must be printable ASCII without spaces", k)
			}
		}
		if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return bad("header %q: value must be valid UTF-8 without NUL", k)
		}
	}
	return nil
}
