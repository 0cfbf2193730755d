package idem

import (
	"context"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// Hook is any value that implements one or more optional hook interfaces:
// the processor's below (OutcomeHook, AttemptHook, TraceHook) and those of
// the other parts of idem, declared where their events happen (the broker
// hooks of package idembroker: settlements, dead letters, redeliveries,
// reconnects). One value — package idemprom's Metrics implements them
// all — goes in Config.Hooks, and every part of idem calls what it
// implements: the processor its outcomes and attempts, the broker adapters
// (which take the hooks from the processor) their settlements and dead
// letters. A package with hooks of its own declares each as a small
// interface with On-named methods and calls them with [Each]. Hooks are
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
	Class idemstore.ErrorClass
	Err   error
	// Again is set when the policy tries again, after Wait.
	Again bool
	Wait  time.Duration
}

// TraceHook wraps the processing of each message and batch in a span of
// work, and, unlike the hooks that only observe, gives the handler the
// context it returns: the handler's own database and HTTP spans nest under
// the message's. Package idemotel implements it for OpenTelemetry. A
// processor without one pays a nil check.
//
// StartMessage is called once per message in each call of Process,
// ProcessTx, ProcessBatch and ProcessBatchInOrder, before anything else,
// and end exactly once, with the message's result, when the call returns it
// (after it was logged and counted): the tries in place and their backoff
// happen in between, one span per call whatever the retries.
//
// StartBatch is called for a batch of more than one message (a batch of
// one is traced as its message alone), before StartMessage of each of its
// messages, which is given the context StartBatch returned; end is called
// once with the results, in the order of msgs, after every message's end.
// In the batch's shared transaction a handler runs under its own message's
// context, bounded by the transaction's deadline; a Config.HandleBatch
// runs under the batch's.
//
// TraceAttempt is AttemptHook with the context of the failed try: the
// message's, or the batch's for the batch's shared transaction.
//
// When Config.Hooks holds several TraceHooks, each starts under the context
// of the one before it, and they end in reverse order.
type TraceHook interface {
	StartMessage(ctx context.Context, consumer string, msg Message) (context.Context, func(Result))
	StartBatch(ctx context.Context, consumer string, msgs []Message) (context.Context, func([]Result))
	TraceAttempt(ctx context.Context, consumer string, a Attempt)
}

// Hooks returns the processor's hooks (Config.Hooks), for the adapters
// that call them.
func (p *Processor[TTx]) Hooks() []Hook { return p.hooks }

// Each calls f with every hook of hs that implements H.
func Each[H any](hs []Hook, f func(H)) {
	for _, h := range hs {
		if x, ok := h.(H); ok {
			f(x)
		}
	}
}

// startMessage starts msg's spans with every TraceHook; end ends them.
func (p *Processor[TTx]) startMessage(ctx context.Context, msg Message) (_ context.Context, end func(Result)) {
	if len(p.tracers) == 1 {
		ctx, end = p.tracers[0].StartMessage(ctx, p.cfg.Consumer, msg)
		return ctx, orNop(end)
	}
	ends := make([]func(Result), len(p.tracers))
	for i, t := range p.tracers {
		ctx, ends[i] = t.StartMessage(ctx, p.cfg.Consumer, msg)
	}
	return ctx, func(r Result) {
		for i := len(ends) - 1; i >= 0; i-- {
			orNop(ends[i])(r)
		}
	}
}

// startBatch starts msgs' batch spans with every TraceHook; end ends them.
func (p *Processor[TTx]) startBatch(ctx context.Context, msgs []Message) (_ context.Context, end func([]Result)) {
	ends := make([]func([]Result), len(p.tracers))
	for i, t := range p.tracers {
		ctx, ends[i] = t.StartBatch(ctx, p.cfg.Consumer, msgs)
	}
	return ctx, func(rs []Result) {
		for i := len(ends) - 1; i >= 0; i-- {
			orNop(ends[i])(rs)
		}
	}
}

func orNop[T any](f func(T)) func(T) {
	if f == nil {
		return func(T) {}
	}
	return f
}
