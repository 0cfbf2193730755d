package idemnats

import "github.com/idemkit/idem"

// Verb is what the consumer does with one message at the server.
type Verb int

const (
	// Ack: the effect committed (Applied) or had committed before
	// (Duplicate). Sent only after the commit; a DoubleAck, confirmed by
	// the server, when Config.ConfirmAcks is set.
	Ack Verb = iota + 1
	// Nak: NakWithDelay with the processor's backoff. The message was not
	// applied and its try counted (a commit whose outcome is unknown);
	// the server delivers it again after the delay.
	Nak
	// DeadLetter: the message is published, with its headers and the
	// x-idem-* headers, to the dead-letter subject, and the server's
	// PubAck from the dead-letter stream is waited for; only then is the
	// original terminated (TermWithReason). A copy the server does not
	// take is published again, with the message kept alive by
	// heartbeats: a dead letter is never dropped. The copy carries
	// Nats-Msg-Id "<stream>/<sequence>", so the dead-letter stream keeps
	// one copy of a message whose Term was lost and which came back.
	DeadLetter
	// Hold: nothing is sent but InProgress heartbeats. The message was not
	// applied and it was not its fault (the inbox database unreachable or
	// not set up); the consumer keeps it and processes it again after the
	// disposition's delay, taking nothing new meanwhile, so order holds
	// and no delivery is spent. At shutdown a held message is Nak'd, for
	// the next consumer to take at once.
	Hold
)

// String returns the lower-case name used in logs and metric labels.
func (v Verb) String() string {
	switch v {
	case Ack:
		return "ack"
	case Nak:
		return "nak"
	case DeadLetter:
		return "dead_letter"
	case Hold:
		return "hold"
	}
	return "unknown"
}

// VerbFor is the consumer's one table from the processor's decision
// ([idem.Processor.Dispose]) to JetStream verbs. The consumer decides
// nothing else about a message: how often it is tried, how long it waits
// and whether it is dead-lettered are all the processor's.
//
//   - ActionAck → Ack (or DoubleAck), only after the commit
//   - ActionRedeliver → NakWithDelay(Delay)
//   - ActionHold → Hold: InProgress heartbeats, processed again after Delay
//   - ActionDeadLetter → DeadLetter: publish to the dead-letter stream,
//     wait for its PubAck, then TermWithReason
//   - anything else → Nak: when in doubt, let the server keep it
func VerbFor(a idem.Action) Verb {
	switch a {
	case idem.ActionAck:
		return Ack
	case idem.ActionRedeliver:
		return Nak
	case idem.ActionHold:
		return Hold
	case idem.ActionDeadLetter:
		return DeadLetter
	}
	return Nak
}
