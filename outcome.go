package idem

import (
	"time"

	"github.com/idemkit/idem/idemstore"
)

// Outcome is what became of one message. Each adapter maps outcomes onto its
// broker's verbs in one place (ack, nack, dead letter).
type Outcome int

const (
	// Applied: the marker and the effect committed together. Ack.
	Applied Outcome = iota + 1
	// Duplicate: the key was already claimed; nothing was written. Ack.
	Duplicate
	// Retry: the message was not applied and may be tried again later (a
	// transient error outlived the retry budget, the commit outcome is
	// unknown, or processing was cancelled). Do not ack; let the broker
	// redeliver.
	Retry
	// DeadLettered: bad input, a permanent error or a poison message. Send it
	// to the dead-letter path with Result.Err; never ack it as applied.
	DeadLettered
	// Expired: the message is older than the inbox retention window, so it
	// cannot be proven new. Dead-lettered unless the user opts in.
	Expired
)

var outcomeNames = [...]string{"", "applied", "duplicate", "retry", "dead_lettered", "expired"}

// String returns the lower-case name used in logs and metric labels.
func (o Outcome) String() string {
	if o < Applied || o > Expired {
		return "unknown"
	}
	return outcomeNames[o]
}

// Acked reports whether the outcome lets the broker forget the message as
// done: Applied and Duplicate. Everything else either returns to the broker
// or goes to the dead-letter path.
func (o Outcome) Acked() bool { return o == Applied || o == Duplicate }

// Result describes what happened to one message.
type Result struct {
	Outcome Outcome
	// MessageID and Key identify the message and its inbox key (Key is empty
	// when the key could not be computed).
	MessageID string
	Key       string
	// Err explains Retry, DeadLettered and Expired; nil otherwise.
	Err error
	// Attempts is how many transactions the processor ran with this message
	// in this call (a failed batch counts as one, and so does each try while
	// waiting for an unreachable database). The retry budget counts only
	// the tries that were the message's own; see RetryPolicy.
	Attempts int
	// First describes the marker that won, for a Duplicate when known.
	First *idemstore.Marker
	// Conflict is set on a Duplicate whose body differs from the body that
	// won: the same key was reused for different content, usually a producer
	// bug.
	Conflict bool
	// Blameless is set on a Retry that is not the message's doing: the inbox
	// database could not be reached ([ErrUnavailable]), processing was
	// cancelled, or the message was not attempted because an earlier one
	// must be retried first ([ErrNotAttempted]). Adapters retry such a
	// message without spending its delivery budget; every other Retry
	// counts against it, so nothing loops forever.
	Blameless bool
	// Untimed is set when the message carried no usable event time (see
	// Config.RefuseUntimed), and TimeSource says where its time came from.
	Untimed    bool
	TimeSource TimeSource
	// PrunedOn is set when the key was among the markers a prune deleted
	// that day (see Config.RefuseLate): an Applied message with PrunedOn is
	// probably applied a second time; an Expired one was refused for it.
	PrunedOn time.Time
	// Disposition is what the adapter does with the delivery, decided by
	// [Processor.Dispose] when Process, ProcessBatch or ProcessBatchInOrder
	// returns, or ProcessTx returns a nil error: the adapter carries it out
	// and decides nothing. After a ProcessTx error it is zero: the caller
	// rolls back and decides what becomes of the delivery.
	Disposition Disposition
}
