package idemredis

import (
	"github.com/idemkit/idem/idembroker"
	"time"

	"github.com/idemkit/idem"
)

// This file is the adapter's one seam with the shared kit of the root
// package: the health state, the hooks, the dead-letter field names and
// the backoff. Everything else in the package speaks to it through kit.

// Fields added to a dead letter, next to the original entry's fields; the
// same names idemrabbitmq and idemkafka give their headers.
const (
	// FieldReason says why: the error of the result.
	FieldReason = "x-idem-reason"
	// FieldOutcome is the outcome: dead_lettered or expired.
	FieldOutcome = "x-idem-outcome"
	// FieldConsumer is the idem consumer that gave up on the entry.
	FieldConsumer = "x-idem-consumer"
	// FieldAttempts is how many times the processor ran the entry's
	// transaction in the call that dead-lettered it (idem.Result.Attempts).
	FieldAttempts = "x-idem-attempts"
	// FieldOrigin is where the entry came from: stream/entry-ID.
	FieldOrigin = "x-idem-origin"
	// FieldDeliveries is the group's delivery counter of the entry when
	// it was dead-lettered.
	FieldDeliveries = "x-idem-deliveries"
)

// W3C trace context fields: carried, like every field that is not the
// body, in idem.Message.Headers, where the tracing hooks (idemotel) look
// for the producer's trace.
const (
	FieldTraceParent = "traceparent"
	FieldTraceState  = "tracestate"
)

// kit holds the consumer's share of the shared kit.
type kit struct {
	consumer string
	hooks    []idem.Hook
	health   *idembroker.HealthState
	backoff  idem.Backoff
}

func newKit[TTx any](proc *idem.Processor[TTx], source string, cfg *Config) kit {
	k := kit{
		consumer: proc.Consumer(),
		hooks:    append(append([]idem.Hook(nil), proc.Hooks()...), cfg.Hooks...),
		health:   idembroker.NewHealthState(proc.Consumer(), source),
		backoff:  cfg.Backoff,
	}
	k.health.LogTo(cfg.Logger)
	return k
}

// settled tells the hooks (idembroker.SettleHook) and the health what was done
// with an entry, once Redis has it.
func (k *kit) settled(source string, d idem.Disposition, res idem.Result) {
	k.health.Settle(d, res, time.Now())
	idem.Each(k.hooks, func(h idembroker.SettleHook) { h.OnSettle(k.consumer, source, d, res) })
}

// deadLettered tells the hooks (idembroker.DeadLetterHook, [DeadLetterEntryHook])
// that a dead letter was written to dlq, or failed to be (err).
func (k *kit) deadLettered(e Entry, dlq string, res idem.Result, err error) {
	idem.Each(k.hooks, func(h DeadLetterEntryHook) { h.OnDeadLetterEntry(e, res, err) })
	idem.Each(k.hooks, func(h idembroker.DeadLetterHook) { h.OnDeadLetter(k.consumer, dlq, res, err) })
}

// acked tells the [AckHook]s about one XACK.
func (k *kit) acked(stream string, ids []string, err error) {
	idem.Each(k.hooks, func(h AckHook) { h.OnAck(stream, ids, err) })
}

// claimed tells the [ClaimHook]s about entries taken over from idle
// consumers, and entries found deleted.
func (k *kit) claimed(stream string, ids, deleted []string) {
	idem.Each(k.hooks, func(h ClaimHook) { h.OnClaim(stream, ids, deleted) })
}

// pause is the wait before the try-th try of a failing Redis call.
func (k *kit) pause(try int) time.Duration { return k.backoff.Delay(try) }

// The consumer's own hooks, beside idem's (idembroker.SettleHook,
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

// DeadLetterEntryHook follows the copy of an entry to its dead-letter
// stream; err is nil when the copy and the XACK were applied together.
type DeadLetterEntryHook interface {
	OnDeadLetterEntry(e Entry, res idem.Result, err error)
}
