package idemnats

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/internal/logfmt"
)

// HeaderSubject is the header of a dead letter that names the subject the
// original message was published to, where a redrive sends it back; the
// rest of its envelope is idembroker's ([idembroker.EnvelopeHeaders]).
const HeaderSubject = "x-idem-subject"

// DefaultIDHeader is the header that carries the producer's message ID
// when [Config.IDHeader] is unset: JetStream's own publish-dedupe ID, which
// the outbox publisher (package outbox/natspub) sets.
const DefaultIDHeader = "Nats-Msg-Id"

// DefaultTimeHeader is the header that carries the producer's event time
// when [Config.TimeHeader] is unset: idembroker.HeaderEventTime.
const DefaultTimeHeader = idembroker.HeaderEventTime

// Config configures a [Consumer]. Pass it to [NewConsumer], which applies
// the defaults below and refuses an invalid configuration; [Consumer.Run]
// also refuses, at start, a JetStream consumer whose own settings could
// discard a message (see [ErrConfig]).
type Config struct {
	// URL is the server URL, or several comma-separated, as nats.Connect
	// takes them (nats://127.0.0.1:4222). Required. The consumer owns its
	// connection and reconnects for ever.
	URL string
	// Options are further connection options (credentials, TLS, a name).
	// Optional. Reconnection is the consumer's: MaxReconnects is set to
	// unlimited after these.
	Options []nats.Option
	// Stream is the stream to consume. Required; the consumer does not
	// create it.
	Stream string
	// Durable is the name of the durable pull consumer on Stream. Defaults
	// to the processor's consumer name with its dots made underscores. Run
	// creates it when it is missing, with AckWait, MaxAckPending and
	// FilterSubjects below, explicit acks and no MaxDeliver; when it
	// exists, its own settings count, and Run refuses unsafe ones.
	Durable string
	// FilterSubjects restricts a durable Run creates to these subjects.
	// Optional.
	FilterSubjects []string
	// AckWait is the ack wait of a durable Run creates. Defaults to 30s.
	AckWait time.Duration
	// Heartbeat is how often the consumer tells the server it is still at
	// work (InProgress) on each message it fetched and has not settled:
	// while its batch's transaction is open, while its dead letter is
	// written, while it is held for an outage. Defaults to a quarter of
	// the durable's AckWait.
	Heartbeat time.Duration
	// MaxAckPending is the MaxAckPending of a durable Run creates: how many
	// messages the server lets the durable's consumers hold unacked.
	// Defaults to 1000; it must be at least BatchSize.
	MaxAckPending int
	// BatchSize is the most messages fetched at once and processed in one
	// transaction. Defaults to 100; 1 processes each message alone.
	BatchSize int
	// FetchWait is how long one fetch waits for a first message when the
	// stream has none for the consumer. Defaults to 5s. Shorter costs
	// requests while idle; shutdown does not wait for it.
	FetchWait time.Duration
	// IDHeader names the header that carries the message ID. Defaults to
	// "Nats-Msg-Id". A message without it is dead-lettered, never applied.
	IDHeader string
	// TimeHeader names the producer's event-time header, RFC 3339 or Unix
	// milliseconds (idembroker.ParseEventTime). Defaults to
	// idembroker.HeaderEventTime ("x-event-time"). The event time
	// (idem.Message.Time) is taken from the most stable source a message
	// has (idem.EventTime): the time inside a UUIDv7 ID, this header, the
	// time the stream stored the message. A value that is not a time, on
	// a message whose ID carries none, is bad input: the processor
	// dead-letters the message (idem.ErrBadTime), as on every broker.
	TimeHeader string
	// DeadLetterStream is the stream dead letters go to. Defaults to
	// Stream + "_DLQ". Run checks at start that it exists and captures
	// DeadLetterSubject, and refuses to start otherwise (wrapping
	// [ErrNoDeadLetterDestination]), unless CreateDeadLetterStream lets it
	// create the stream.
	DeadLetterStream string
	// DeadLetterSubject is the subject dead letters are published to.
	// Defaults to "idem.dlq." + Stream.
	DeadLetterSubject string
	// CreateDeadLetterStream lets Run create a missing DeadLetterStream
	// with the storage and replicas of Stream, a 2-minute duplicate
	// window, and a MaxAge of the inbox window (idem.Processor.Window; no
	// age limit when the processor has no horizon guard). Defaults to
	// false: a dead-letter stream's retention is the operator's choice.
	CreateDeadLetterStream bool
	// AcceptReplayPastWindow lets Run start on a stream, or a
	// dead-letter stream, that keeps messages longer than the inbox
	// window (idem.Processor.Window), or for ever (MaxAge 0). Defaults to
	// false: Run refuses such a stream, with an error wrapping [ErrConfig]
	// that names both numbers, for a replay from it (a durable reset to an
	// earlier sequence, a redrive of an old dead letter, a redelivery
	// after a restore) could bring back a message whose marker the inbox
	// has already pruned, and the message would be applied a second time
	// unless its event time marks it as expired. Set it when the
	// stream's retention is deliberate and its messages carry their
	// event time (a UUIDv7 ID or the time header), which the horizon
	// guard reads.
	AcceptReplayPastWindow bool
	// ConfirmAcks sends every ack as a DoubleAck: the server confirms it
	// before the message counts as settled. Defaults to false: an ack is
	// sent once the transaction committed and not waited for; one lost
	// with the connection brings the message back after AckWait, as a
	// Duplicate the inbox acks again.
	ConfirmAcks bool
	// Backoff paces the tries after a fetch failed and of a dead letter the
	// server did not take; the pause doubles with each try, with jitter, up
	// to Backoff.Max. How often and how long a message is retried is the
	// processor's RetryPolicy, not this. Defaults to 100ms..5s.
	Backoff idem.Backoff
	// ShutdownGrace is how long, after Run's context is cancelled, the
	// batch in flight may go on to its commit before its transaction is
	// cancelled (rolled back, left to redelivery). Defaults to 10s.
	ShutdownGrace time.Duration
	// Logger receives connection events, held messages and dead-letter
	// failures. Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks are hooks of this consumer alone, called after the
	// processor's (idem.Config.Hooks): values implementing idem's hook
	// interfaces (idembroker.SettleHook, idembroker.DeadLetterHook,
	// idembroker.RedeliveredHook, idembroker.ReconnectHook). Optional.
	Hooks []idem.Hook
	// Faults injects failures at the adapter's fault points ([BeforeSettle]),
	// for tests and drills. Optional; nil costs nothing.
	Faults idem.FaultFunc
}

// BeforeSettle: the batch's transaction has ended (committed, for the
// Applied messages) and the server has not been told yet. An error there
// makes Run return it at once without settling the batch, as a process
// that dies there would: after AckWait the server redelivers the
// messages, and the inbox turns those that committed into Duplicates.
const BeforeSettle idem.FaultPoint = "before_settle"

// ErrConfig is wrapped by every configuration error: from [NewConsumer],
// and from [Consumer.Run] for a durable whose settings would discard
// messages (MaxDeliver set, for JetStream keeps a message it stopped
// delivering in no dead-letter queue; an AckWait shorter than the
// processing budget; acks not explicit) and for a stream that keeps
// messages longer than the inbox window (see
// [Config.AcceptReplayPastWindow]).
var ErrConfig = errors.New("invalid idemnats configuration")

// ErrNoDeadLetterDestination is wrapped by Run's error when the
// dead-letter stream is missing (and may not be created) or does not
// capture the dead-letter subject.
var ErrNoDeadLetterDestination = errors.New("idemnats: no dead-letter destination")

func (c *Config) setDefaults(consumer string) {
	if c.Durable == "" {
		c.Durable = strings.ReplaceAll(consumer, ".", "_")
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1000
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.FetchWait == 0 {
		c.FetchWait = 5 * time.Second
	}
	if c.IDHeader == "" {
		c.IDHeader = DefaultIDHeader
	}
	if c.TimeHeader == "" {
		c.TimeHeader = DefaultTimeHeader
	}
	if c.DeadLetterStream == "" {
		c.DeadLetterStream = c.Stream + "_DLQ"
	}
	if c.DeadLetterSubject == "" {
		c.DeadLetterSubject = "idem.dlq." + c.Stream
	}
	c.Backoff = c.Backoff.WithDefaults(idem.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second})
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = logfmt.Wrap(c.Logger)
}

func (c *Config) validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("URL is required"))
	}
	if c.Stream == "" {
		errs = append(errs, errors.New("stream is required"))
	}
	if strings.ContainsAny(c.Durable, ". *>") {
		errs = append(errs, fmt.Errorf("durable %q must not contain dots, spaces or wildcards", c.Durable))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("batch size %d must be at least 1", c.BatchSize))
	}
	if c.MaxAckPending < c.BatchSize {
		errs = append(errs, fmt.Errorf("max ack pending %d must be at least batch size %d, or batches could never fill", c.MaxAckPending, c.BatchSize))
	}
	if c.AckWait < 0 || c.Heartbeat < 0 || c.FetchWait < 0 || c.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("ack wait %v, heartbeat %v, fetch wait %v and shutdown grace %v must not be negative", c.AckWait, c.Heartbeat, c.FetchWait, c.ShutdownGrace))
	}
	if err := checkBudget(c.AckWait, c.heartbeat(c.AckWait)); err != nil {
		errs = append(errs, err)
	}
	if err := c.Backoff.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.IDHeader == c.TimeHeader {
		errs = append(errs, fmt.Errorf("ID header and time header are both %q", c.IDHeader))
	}
	if c.DeadLetterStream == c.Stream {
		errs = append(errs, fmt.Errorf("dead-letter stream %q must not be the consumed stream", c.DeadLetterStream))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// heartbeat is the heartbeat interval for a durable whose AckWait is
// ackWait.
func (c *Config) heartbeat(ackWait time.Duration) time.Duration {
	if c.Heartbeat > 0 {
		return c.Heartbeat
	}
	return ackWait / 4
}

// checkBudget refuses an AckWait shorter than the processing budget: the
// longest a message the consumer holds may go without a word to the
// server, two heartbeat intervals (one heartbeat late, the next on its
// way). Past AckWait the server hands the message to another consumer
// while this one still works on it.
func checkBudget(ackWait, heartbeat time.Duration) error {
	if ackWait <= 0 {
		return nil // the server's default, read at start
	}
	if budget := 2 * heartbeat; ackWait <= budget {
		return fmt.Errorf("ack wait %v is shorter than the processing budget %v (two heartbeats of %v): the server would redeliver messages still being processed; raise AckWait or lower Heartbeat",
			ackWait, budget, heartbeat)
	}
	return nil
}
