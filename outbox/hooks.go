package outbox

import "time"

// The relay's hooks go in RelayConfig.Hooks, an [idem.Hook] list like the
// processor's: any value implementing one or more of the interfaces below
// (package idemprom's Metrics implements them all). Hooks are called inline
// from the relay's goroutine: they must be safe for concurrent use
// (several relays may share one) and return quickly.

// PublishHook receives each batch of records the broker confirmed and the
// relay marked sent, per destination.
type PublishHook interface {
	OnPublish(destination string, n int)
}

// RefuseHook receives every record the broker refused; parked says it
// used up its attempts and was parked.
type RefuseHook interface {
	OnRefuse(r Record, err error, parked bool)
}

// OutageHook receives every failure to reach the broker or the database,
// with how long the relay now waits before it tries again.
type OutageHook interface {
	OnOutage(err error, wait time.Duration)
}
