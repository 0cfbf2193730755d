package idembroker

import "github.com/idemkit/idem"

// The broker hooks: optional interfaces that any value in a processor's
// hooks (idem.Config.Hooks) or in an adapter's own Config.Hooks may
// implement, beside the processor's (idem.OutcomeHook, idem.AttemptHook,
// idem.TraceHook). One list of [idem.Hook] values, one pattern: a value is
// called for each interface it implements, and nothing else is needed to
// register it. An adapter calls them through its [Settler]; an event only
// one broker has (a Kafka offset commit, a Kafka data loss) is an optional
// interface of that adapter's package, in the same list. Hooks are called
// inline from the consumer's goroutines: they must be safe for concurrent
// use and return quickly.

// SettleHook receives what an adapter told its broker about one message,
// once the frame or commit was sent: its disposition and result. source is
// the queue, or topic/partition. A message held (idem.ActionHold) is not
// settled at the broker, on an adapter that keeps it unacknowledged
// (RabbitMQ); an adapter that settles a hold by retrying in place (Kafka)
// reports it when it gives the message back.
type SettleHook interface {
	OnSettle(consumer, source string, d idem.Disposition, r idem.Result)
}

// DeadLetterHook receives each dead letter an adapter wrote, once it is
// durable at its destination (err nil) or failed to be (err set; the
// message is then not settled and comes again).
type DeadLetterHook interface {
	OnDeadLetter(consumer, destination string, r idem.Result, err error)
}

// RedeliveredHook receives each delivery the broker flagged as seen before
// (a hint only: the inbox decides).
type RedeliveredHook interface {
	OnRedelivered(consumer, source string)
}

// ReconnectHook receives each broker session that ended with err while the
// consumer goes on: it is about to connect again.
type ReconnectHook interface {
	OnReconnect(consumer, source string, err error)
}
