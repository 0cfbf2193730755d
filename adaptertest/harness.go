package adaptertest

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// Harness is what a broker adapter gives the suite: a way to make a fresh
// topic (a queue and its dead-letter queue, a topic and its dead-letter
// topic), to publish to it, to build a consumer of it over a processor, and
// to read what reached its dead-letter destination. Every method may fail
// t; each must be safe to call from parallel tests.
type Harness interface {
	// Features says what the broker promises.
	Features() Features
	// Topic creates a topic no other test uses, with its dead-letter
	// destination, removed when t ends, and returns its name.
	Topic(t testing.TB) string
	// Publish publishes msgs to topic, in order, and returns once the
	// broker confirmed every one (publisher confirm, acks from all in-sync
	// replicas).
	Publish(t testing.TB, topic string, msgs ...Message)
	// Consumer builds, without starting it, a consumer of topic into proc
	// as opts say. Consumers of one topic share its progress (one queue,
	// one consumer group): a second consumer takes up what the first did
	// not settle. The suite runs it and cancels Run's context to stop it.
	Consumer(t testing.TB, topic string, proc *idem.Processor[pgx.Tx], opts ConsumerOptions) Consumer
	// DeadLetters returns every message that reached topic's dead-letter
	// destination so far, in the order they arrived. The suite calls it
	// repeatedly while it waits; it must not return a dead letter twice
	// unless it arrived twice.
	DeadLetters(t testing.TB, topic string) []DeadLetter
}

// Features says what a broker promises, so that the suite holds an adapter
// to that and to no more. The zero value promises nothing optional.
type Features struct {
	// Ordered: one consumer of a topic gets its messages in the order they
	// were published (a queue with one consumer; a Kafka topic of one
	// partition), and the adapter applies them in that order.
	Ordered bool
	// ErrNoDeadLetterDestination is the error Run wraps when it refuses to
	// start because the dead-letter destination is missing or refused.
	// Nil accepts any error.
	ErrNoDeadLetterDestination error
	// StopWithin is how long Run may take to return once its context is
	// cancelled, in an outage too. Defaults to 5s; a harness keeps the
	// adapter's shutdown grace below it.
	StopWithin time.Duration
	// Known names checks ("SettledOnce", or one path: "SettledOnce/batch")
	// that fail because of a known bug of the adapter, with a one-line
	// description of it; the suite skips them with "known: <description>".
	// Keep it empty: it is the list of what to fix.
	Known map[string]string
}

// Message is one message to publish.
type Message struct {
	// ID is the producer's message ID, in the place the adapter reads it
	// from by default (the AMQP message_id property, the idem-message-id
	// header). Empty publishes the message without an ID.
	ID string
	// Body is the payload.
	Body []byte
	// EventTime, when set, goes in the producer's event-time header
	// (x-event-time, RFC 3339).
	EventTime time.Time
	// Timestamp, when set, is the broker timestamp (the AMQP timestamp
	// property, the Kafka record timestamp).
	Timestamp time.Time
}

// DeadLetter is a message read from a dead-letter destination.
type DeadLetter struct {
	// ID is the message ID it carries, read where the adapter reads it.
	ID string
	// Body is its payload.
	Body []byte
	// Headers are its headers as strings (integers in decimal), the
	// x-idem-* headers the adapter added included.
	Headers map[string]string
}

// attempts is the dead letter's x-idem-attempts, or -1.
func (d DeadLetter) attempts() int {
	n, err := strconv.Atoi(d.Headers[idembroker.HeaderAttempts])
	if err != nil {
		return -1
	}
	return n
}

// ConsumerOptions is how the suite wants a consumer built.
type ConsumerOptions struct {
	// BatchSize bounds the messages that share one transaction (RabbitMQ
	// Config.BatchSize, Kafka Config.MaxBatch). 0 keeps the adapter's
	// default; 1 processes every message alone.
	BatchSize int
	// NoDeadLetterDestination makes the consumer's dead-letter destination
	// one that does not exist and that the consumer may not create (a
	// missing exchange, a missing topic with creation off): Run must
	// refuse to start.
	NoDeadLetterDestination bool
	// CrashBeforeAck makes the consumer fail once at the adapter's own
	// fault point between the database commit and the ack, the way a
	// process that dies there does (RabbitMQ BeforeSettle: the connection
	// is cut and the consumer reconnects; Kafka BeforeOffsetCommit: Run
	// returns ErrCrashed, and the suite starts another consumer).
	CrashBeforeAck bool
	// Logger is the test's logger, for the consumer's own lines.
	Logger *slog.Logger
}

// Consumer is a consumer built by a harness: an idemrabbitmq or idemkafka
// Consumer, or a wrapper around one.
type Consumer interface {
	Run(ctx context.Context) error
}

// Cutter is implemented by a Consumer whose broker connection the harness
// can cut, as a network failure would (RabbitMQ: the socket closed; Kafka:
// the client's connections through a proxy closed). Cut reports whether a
// connection was open. The suite's connection check runs only for such
// consumers.
type Cutter interface {
	Cut() bool
}

// DeadLetterBreaker is implemented by a Harness that can take a topic's
// dead-letter destination away under a running consumer (delete the
// dead-letter queue, the dead-letter topic) and bring it back empty. The
// suite's lost-destination check runs only for such harnesses; it does
// not call DeadLetters while the destination is away.
type DeadLetterBreaker interface {
	DropDeadLetters(t testing.TB, topic string)
	RestoreDeadLetters(t testing.TB, topic string)
}

func (f Features) stopWithin() time.Duration {
	if f.StopWithin > 0 {
		return f.StopWithin
	}
	return 5 * time.Second
}
