package idem

import "time"

// Hook is any value that implements one or more of the hook interfaces
// below: OutcomeHook, AttemptHook, SettleHook, DeadLetterHook,
// RedeliveredHook (the retention hooks of package retention complete the
// set). One value — package idemprom's Metrics implements them all — goes
// in Config.Hooks, and every part of idem calls what it implements: the
// processor its outcomes and attempts, the broker adapters (which take the
// hooks from the processor) their settlements and dead letters. Hooks are
// called inline from the goroutine that did the work: they must be safe for
// concurrent use and return quickly.
type Hook any

// OutcomeHook receives every result a processor produces, with the time its
// transaction took (for a batch, the whole batch's time).
type OutcomeHook interface {
	OnOutcome(consumer string, r Result, elapsed time.Duration)
}

// AttemptHook receives every failed try of a transaction, with what the
// retry policy made of it: why a batch fell back to one message at a
// time, why a message was waited for, when its budget ran out.
type AttemptHook interface {
	OnAttempt(consumer string, a Attempt)
}

// Attempt is one failed try of a transaction.
type Attempt struct {
	// MessageIDs are the messages the transaction carried.
	MessageIDs []string
	// Batch is set for a batch's shared transaction, whose failure sends
	// its messages one at a time.
	Batch bool
	// Try numbers the tries of this transaction, from 1.
	Try int
	// Class is the error's class: whether it is the message's fault.
	Class ErrorClass
	Err   error
	// Again is set when the policy tries again, after Wait.
	Again bool
	Wait  time.Duration
}

// SettleHook receives what a broker adapter told its broker about one
// message, once the frame or commit was sent. source is the queue or
// topic/partition.
type SettleHook interface {
	OnSettle(consumer, source string, d Disposition, r Result)
}

// DeadLetterHook receives each dead letter an adapter wrote, once it is
// durable at its destination (err nil) or failed to be (err set; the
// message is then not settled and comes again).
type DeadLetterHook interface {
	OnDeadLetter(consumer, destination string, r Result, err error)
}

// RedeliveredHook receives each delivery the broker flagged as seen before
// (a hint only: the inbox decides).
type RedeliveredHook interface {
	OnRedelivered(consumer, source string)
}

// Hooks returns the processor's hooks (Config.Hooks, and Config.Observer
// when set), for the adapters that call them.
func (p *Processor[TTx]) Hooks() []Hook { return p.hooks }

// Each calls f with every hook of hs that implements H.
func Each[H any](hs []Hook, f func(H)) {
	for _, h := range hs {
		if x, ok := h.(H); ok {
			f(x)
		}
	}
}

// observerHook lets a Config.Observer be an OutcomeHook.
type observerHook struct{ o Observer }

func (h observerHook) OnOutcome(consumer string, r Result, elapsed time.Duration) {
	h.o.Observe(consumer, r, elapsed)
}
