package idembroker

import (
	"log/slog"
	"time"

	"github.com/idemkit/idem"
)

// Settler is an adapter's one way out for what happened at the broker: it
// keeps the consumer's [HealthState] and calls the broker hooks. Each
// method is the whole step for its event, so an adapter makes one call
// where the event happens and never updates health or calls a hook
// itself. It is safe for concurrent use.
type Settler struct {
	consumer string
	health   *HealthState
	hooks    []idem.Hook
}

// NewSettler returns the settle step of the consumer named consumer (the
// processor's name), which consumes from source (the queue, or the topics
// joined by commas) and calls hooks: the processor's (idem.Processor.Hooks)
// followed by the adapter's own. The end of each hold for an outage is
// logged on log (nil: not logged).
func NewSettler(consumer, source string, hooks []idem.Hook, log *slog.Logger) *Settler {
	h := NewHealthState(consumer, source)
	if log != nil {
		h.LogTo(log)
	}
	return &Settler{consumer: consumer, health: h, hooks: hooks}
}

// Health is the consumer's health state, for the events of its run that are
// not settlements (start, connect, a failure).
func (s *Settler) Health() *HealthState { return s.health }

// Hooks returns the hooks the settler calls, for an adapter's own optional
// interfaces.
func (s *Settler) Hooks() []idem.Hook { return s.hooks }

// Settle is the step after the disposition d of result r was carried out
// at the broker for a message from source: the health records it and
// every [SettleHook] is told.
func (s *Settler) Settle(source string, d idem.Disposition, r idem.Result, now time.Time) {
	s.health.Settle(d, r, now)
	idem.Each(s.hooks, func(h SettleHook) { h.OnSettle(s.consumer, source, d, r) })
}

// DeadLetter tells every [DeadLetterHook] that the dead letter of r was
// written to destination (err nil) or failed to be (err set).
func (s *Settler) DeadLetter(destination string, r idem.Result, err error) {
	idem.Each(s.hooks, func(h DeadLetterHook) { h.OnDeadLetter(s.consumer, destination, r, err) })
}

// Redelivered tells every [RedeliveredHook] of a delivery from source the
// broker flagged as seen before.
func (s *Settler) Redelivered(source string) {
	idem.Each(s.hooks, func(h RedeliveredHook) { h.OnRedelivered(s.consumer, source) })
}

// Reconnect tells every [ReconnectHook] that the broker session on source
// ended with err and the consumer connects again. (The end of the session
// itself is [HealthState.Disconnect], for a shutdown too.)
func (s *Settler) Reconnect(source string, err error) {
	idem.Each(s.hooks, func(h ReconnectHook) { h.OnReconnect(s.consumer, source, err) })
}
