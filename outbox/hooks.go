package outbox

import "time"

// Hook is any value that implements one or more of the hook interfaces
// below; it goes in RelayConfig.Hooks. Hooks are called inline from the
// relay's goroutine: they must be safe for concurrent use (several relays
// may share one) and return quickly.
type Hook any

// PublishHook receives each batch of records the broker confirmed and the
// relay marked sent, per destination.
type PublishHook interface {
	OnPublished(destination string, n int)
}

// RefuseHook receives every record the broker refused; parked says it
// used up its attempts and was parked.
type RefuseHook interface {
	OnRefused(r Record, err error, parked bool)
}

// OutageHook receives every failure to reach the broker or the database,
// with how long the relay now waits before it tries again.
type OutageHook interface {
	OnOutage(err error, wait time.Duration)
}
