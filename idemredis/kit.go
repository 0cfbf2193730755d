package idemredis

import (
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// Field names of an entry: the header contract of package idembroker, so
// that an entry reads like a message of any other broker of idem.
const (
	// DefaultIDField carries the producer-assigned message ID
	// (idembroker.HeaderMessageID); Config.IDField may name another.
	DefaultIDField = idembroker.HeaderMessageID
	// DefaultTimeField carries the producer's event time, RFC 3339 or
	// Unix milliseconds (idembroker.HeaderEventTime).
	DefaultTimeField = idembroker.HeaderEventTime
	// DefaultBodyField carries the payload.
	DefaultBodyField = "body"
	// DefaultKeyField carries the routing key (idem.Message.Key).
	DefaultKeyField = "key"
)

// Fields a dead letter carries next to the original entry's fields: its
// idembroker.Envelope, under the kit's header names, and the delivery
// counter, which only Redis has.
const (
	// FieldReason says why: the error of the result (idembroker.HeaderReason).
	FieldReason = idembroker.HeaderReason
	// FieldOutcome is the outcome: dead_lettered or expired.
	FieldOutcome = idembroker.HeaderOutcome
	// FieldConsumer is the idem consumer that gave up on the entry.
	FieldConsumer = idembroker.HeaderConsumer
	// FieldAttempts is how many times the processor ran the entry's
	// transaction in the call that dead-lettered it (idem.Result.Attempts).
	FieldAttempts = idembroker.HeaderAttempts
	// FieldOrigin is where the entry came from: stream/entry-ID.
	FieldOrigin = idembroker.HeaderOrigin
	// FieldRedriven counts the redrives of the entry (idembroker.HeaderRedriven).
	FieldRedriven = idembroker.HeaderRedriven
	// FieldDeliveries is the group's delivery counter of the entry when it
	// was dead-lettered.
	FieldDeliveries = "x-idem-deliveries"
)

// W3C trace context fields: carried, like every field that is not the
// body, in idem.Message.Headers, where the tracing hooks (idemotel) look
// for the producer's trace.
const (
	FieldTraceParent = idembroker.HeaderTraceParent
	FieldTraceState  = idembroker.HeaderTraceState
)

// The consumer's own hooks, beside the kit's (idembroker.SettleHook,
// idembroker.DeadLetterHook): optional interfaces that any value in the
// processor's hooks or in [Config.Hooks] may implement. Methods are called
// from Run's goroutine and must return quickly.

// AckHook follows every XACK; err is nil when Redis answered it.
type AckHook interface {
	OnAck(stream string, ids []string, err error)
}

// ClaimHook follows every XAUTOCLAIM that took entries over from an idle
// consumer (this one included, after a restart), or found entries of the
// pending list whose data was deleted or trimmed from the stream (Redis
// drops them from the pending list: they are lost to every consumer).
type ClaimHook interface {
	OnClaim(stream string, ids, deleted []string)
}

// acked tells the [AckHook]s about one XACK.
func (c *Consumer[TTx]) acked(stream string, ids []string, err error) {
	idem.Each(c.set.Hooks(), func(h AckHook) { h.OnAck(stream, ids, err) })
}

// claimed tells the [ClaimHook]s about entries taken over from idle
// consumers, and entries found deleted.
func (c *Consumer[TTx]) claimed(stream string, ids, deleted []string) {
	idem.Each(c.set.Hooks(), func(h ClaimHook) { h.OnClaim(stream, ids, deleted) })
}

// deadLettered tells the settler (idembroker.DeadLetterHook) that a dead
// letter was written to dlq, or failed to be (err): the copy and the XACK
// were applied together, or neither was.
func (c *Consumer[TTx]) deadLettered(_ Entry, dlq string, res idem.Result, err error) {
	c.set.DeadLetter(dlq, res, err)
}
