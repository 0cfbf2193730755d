package idemnats

import (
	"github.com/idemkit/idem/idembroker"
	"log/slog"
	"time"

	"github.com/idemkit/idem"
)

// This file is the adapter's one seam to the shared adapter kit of package
// idem: the health state, the hook lists and their dispatch, the backoff
// and the header names every adapter shares. The rest of the package
// calls these and nothing else of it.

// Headers added to a dead letter, next to the original message's headers.
// idemrabbitmq and idemkafka use the same names.
const (
	// HeaderReason says why: the error of the result.
	HeaderReason = "x-idem-reason"
	// HeaderOutcome is the outcome: dead_lettered or expired.
	HeaderOutcome = "x-idem-outcome"
	// HeaderConsumer is the idem consumer that gave up on the message.
	HeaderConsumer = "x-idem-consumer"
	// HeaderAttempts is how many times the processor ran the message's
	// transaction in the call that dead-lettered it (idem.Result.Attempts).
	HeaderAttempts = "x-idem-attempts"
	// HeaderOrigin is where the message came from: stream/sequence.
	HeaderOrigin = "x-idem-origin"
	// HeaderSubject is the subject the message was published to.
	HeaderSubject = "x-idem-subject"
)

// DefaultIDHeader is the header that carries the producer's message ID
// when [Config.IDHeader] is unset: JetStream's own publish-dedupe ID, which
// the outbox publisher (package outbox/natspub) sets.
const DefaultIDHeader = "Nats-Msg-Id"

// DefaultTimeHeader is the header that carries the producer's event time
// when [Config.TimeHeader] is unset, as RFC 3339 or Unix milliseconds.
const DefaultTimeHeader = "x-event-time"

// kit holds the consumer's share of the adapter kit.
type kit struct {
	consumer string
	source   string
	hs       *idembroker.HealthState
	hooks    []idem.Hook
	backoff  idem.Backoff
}

func newKit[TTx any](proc *idem.Processor[TTx], source string, hooks []idem.Hook, backoff idem.Backoff, log *slog.Logger) *kit {
	h := idembroker.NewHealthState(proc.Consumer(), source)
	h.LogTo(log) // the end of an outage's hold
	return &kit{
		consumer: proc.Consumer(),
		source:   source,
		hs:       h,
		hooks:    append(append([]idem.Hook(nil), proc.Hooks()...), hooks...),
		backoff:  backoff,
	}
}

// wait is the pause before try n (1-based) of something that failed:
// capped exponential, with jitter.
func (k *kit) wait(n int) time.Duration { return k.backoff.Delay(n) }

// settled reports a message's disposition carried out at the broker.
func (k *kit) settled(d idem.Disposition, r idem.Result) {
	k.hs.Settle(d, r, time.Now())
	if d.Action == idem.ActionHold {
		return // nothing was told to the broker
	}
	idem.Each(k.hooks, func(h idembroker.SettleHook) { h.OnSettle(k.consumer, k.source, d, r) })
}

// deadLettered reports a dead letter durable at dest (err nil) or not.
func (k *kit) deadLettered(dest string, r idem.Result, err error) {
	idem.Each(k.hooks, func(h idembroker.DeadLetterHook) { h.OnDeadLetter(k.consumer, dest, r, err) })
}

// redelivered reports a delivery JetStream counted as not the first.
func (k *kit) redelivered() {
	idem.Each(k.hooks, func(h idembroker.RedeliveredHook) { h.OnRedelivered(k.consumer, k.source) })
}

// The consumer's events, recorded for [Consumer.Health].

func (k *kit) health() idembroker.Health { return k.hs.Health() }
func (k *kit) started()                  { k.hs.Start(time.Now()) }
func (k *kit) stopped()                  { k.hs.Stop(time.Now()) }
func (k *kit) connected()                { k.hs.Connect(time.Now()) }
func (k *kit) disconnected(err error)    { k.hs.Disconnect(err, time.Now()) }
func (k *kit) failed(err error)          { k.hs.Fail(err, time.Now()) }
func (k *kit) reachable()                { k.hs.Reachable(time.Now()) }
func (k *kit) unreachable(err error)     { k.hs.Unreachable(err, time.Now()) }
func (k *kit) begin() (token uint64)     { return k.hs.Begin(time.Now()) }
func (k *kit) end(token uint64)          { k.hs.End(token, time.Now()) }
