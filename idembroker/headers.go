package idembroker

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// The header contract: the names every adapter, publisher, the dead-letter
// tools and the tests read and write. A message carries its identity and
// event time in the first two (RabbitMQ may carry the identity in the
// AMQP message_id property instead); a dead letter carries, beside the
// original message's headers, its [Envelope].
const (
	// HeaderMessageID carries the producer-assigned message ID where the
	// broker has no property for it (Kafka's default ID header).
	HeaderMessageID = "idem-message-id"
	// HeaderEventTime carries when the event happened, as RFC 3339
	// ("2026-09-01T02:14:11Z", fractions allowed) or Unix milliseconds
	// (see [ParseEventTime]). It is read when the message ID is not a
	// UUIDv7, ahead of the broker's timestamp, which a republish refreshes.
	HeaderEventTime = "x-event-time"

	// HeaderReason is the dead letter's reason: the error that
	// dead-lettered the message (idem.Disposition.Reason).
	HeaderReason = "x-idem-reason"
	// HeaderOutcome is the dead letter's outcome: "dead_lettered" or
	// "expired".
	HeaderOutcome = "x-idem-outcome"
	// HeaderConsumer is the consumer (processor) that gave the message up.
	HeaderConsumer = "x-idem-consumer"
	// HeaderAttempts is how many times the processor ran the message's
	// transaction in the call that dead-lettered it (idem.Result.Attempts),
	// an integer.
	HeaderAttempts = "x-idem-attempts"
	// HeaderOrigin is where the dead letter came from: the queue (RabbitMQ)
	// or topic/partition/offset (Kafka).
	HeaderOrigin = "x-idem-origin"
	// HeaderRedriven counts the redrives of a message: a redrive removes
	// the envelope's other headers and sets this one to one more than it
	// was.
	HeaderRedriven = "x-idem-redriven"
)

// The W3C Trace Context and Baggage headers, which carry the producer's
// span to the consumer (package idemotel reads and writes them).
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
	HeaderBaggage     = "baggage"
)

// EnvelopeHeaders are the headers of an [Envelope], which a redrive removes
// from a dead letter before sending it back.
var EnvelopeHeaders = []string{HeaderReason, HeaderOutcome, HeaderConsumer, HeaderAttempts, HeaderOrigin, HeaderRedriven}

// Envelope is what a dead letter carries besides the original message and
// its headers: why it was given up, by whom, after how many runs, and where
// it came from. An adapter writes it with [Envelope.Write]; the dead-letter
// tools read it back with [ReadEnvelope].
type Envelope struct {
	// Reason is the error that dead-lettered the message.
	Reason string
	// Outcome is the result's outcome ("dead_lettered", "expired").
	Outcome string
	// Consumer is the processor's consumer name.
	Consumer string
	// Attempts is idem.Result.Attempts.
	Attempts int
	// Origin is the queue, or topic/partition/offset, it was consumed from.
	Origin string
	// Redriven is how many times the message was redriven before.
	Redriven int
}

// NewEnvelope returns the envelope of the dead letter for result r with
// disposition d, which consumer took from origin. Its reason is d.Reason,
// or the outcome when the result carries no error.
func NewEnvelope(consumer, origin string, r idem.Result, d idem.Disposition) Envelope {
	reason := d.Reason
	if reason == "" {
		reason = r.Outcome.String()
	}
	return Envelope{Reason: reason, Outcome: r.Outcome.String(), Consumer: consumer, Attempts: r.Attempts, Origin: origin}
}

// Write hands each header of the envelope to text or, for the counts, to
// count, in the order of [EnvelopeHeaders]. Redriven is written only when
// it is not zero: a dead letter keeps the count its original carried.
func (e Envelope) Write(text func(key, value string), count func(key string, n int64)) {
	text(HeaderReason, e.Reason)
	text(HeaderOutcome, e.Outcome)
	text(HeaderConsumer, e.Consumer)
	count(HeaderAttempts, int64(e.Attempts))
	text(HeaderOrigin, e.Origin)
	if e.Redriven != 0 {
		count(HeaderRedriven, int64(e.Redriven))
	}
}

// ReadEnvelope reads the envelope from a dead letter's headers, as
// strings (integers in decimal). A message the broker dead-lettered itself
// carries none: every field is then zero.
func ReadEnvelope(h map[string]string) Envelope {
	return Envelope{
		Reason: h[HeaderReason], Outcome: h[HeaderOutcome], Consumer: h[HeaderConsumer],
		Attempts: headerInt(h[HeaderAttempts]), Origin: h[HeaderOrigin], Redriven: headerInt(h[HeaderRedriven]),
	}
}

// headerInt reads an integer header value; 0 when it is not one.
func headerInt(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}

// ParseEventTime reads a [HeaderEventTime] value: Unix milliseconds (a
// string of digits) or RFC 3339 with optional fractions. Anything else is
// an error: a producer that sent a time meant one, and the message is bad
// input.
func ParseEventTime(v string) (time.Time, error) {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.UnixMilli(ms), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("parsing %q as RFC 3339 or Unix milliseconds: %w", v, err)
	}
	return t, nil
}
