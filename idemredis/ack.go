package idemredis

import "github.com/idemkit/idem"

// Verb is what the consumer does with one entry at Redis.
type Verb int8

const (
	// Ack: XACK, after the database commit. The effect committed (Applied)
	// or had committed before (Duplicate); the entry leaves the group's
	// pending list. The acks of a batch are one XACK.
	Ack Verb = iota + 1
	// Leave: nothing is sent; the entry stays in the pending list and is
	// run again by this consumer after the disposition's delay, alone, so
	// that no later entry of the stream is applied ahead of it. The
	// consumer keeps it from going idle meanwhile; if the consumer stops
	// or dies, another takes it over with XAUTOCLAIM after ClaimIdle, and
	// the group's delivery counter (idem.Message.Attempt) grows by one.
	// Redeliver (its try counted by the processor) and Hold (an outage,
	// nothing spent) both leave the entry: the difference is the
	// processor's count, and Redis has no delay of its own to give back to.
	Leave
	// DeadLetter: one Lua script, atomic on the server, that checks the
	// entry is still pending, copies it with the x-idem-* fields to the
	// dead-letter stream (refused when that stream is missing) and XACKs
	// it. Both or neither: a crash cannot lose the letter or copy it
	// twice. A copy that cannot be written leaves the entry pending and is
	// tried again; a dead letter is never dropped.
	DeadLetter
)

// String returns the lower-case name used in logs and metric labels.
func (v Verb) String() string {
	switch v {
	case Ack:
		return "ack"
	case Leave:
		return "leave"
	case DeadLetter:
		return "dead_letter"
	}
	return "unknown"
}

// VerbFor is the consumer's one table from the processor's decision
// ([idem.Processor.Dispose]) to Redis verbs. The consumer decides nothing
// else about an entry: how often it is tried, how long it waits and
// whether it is dead-lettered are the processor's.
//
//   - ActionAck → Ack (XACK), only after the commit
//   - ActionRedeliver, ActionHold → Leave pending, run again after Delay
//   - ActionDeadLetter → DeadLetter (XADD to the dead-letter stream and
//     XACK, in one script)
//   - anything else → Leave: when in doubt, Redis keeps it
func VerbFor(a idem.Action) Verb {
	switch a {
	case idem.ActionAck:
		return Ack
	case idem.ActionDeadLetter:
		return DeadLetter
	}
	return Leave
}
