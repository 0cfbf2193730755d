package idem

import (
	"context"
	"math/rand/v2"
	"time"
)

// RetryPolicy is how the processor retries a transient failure in process
// before it gives the message back to the broker (outcome Retry). It is the
// only retry policy in idem; the adapters add only the broker's redelivery.
type RetryPolicy struct {
	// MaxAttempts is the number of tries in process, including the first.
	// Defaults to 5. 1 disables retries.
	MaxAttempts int
	// InitialBackoff is the wait before the second try. Defaults to 20ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between tries. Defaults to 2s.
	MaxBackoff time.Duration
}

func (p *RetryPolicy) setDefaults() {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = 5
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = 20 * time.Millisecond
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = 2 * time.Second
	}
}

// Backoff returns the wait before try number attempt+1 (attempt ≥ 1):
// exponential, capped, with full jitter so that consumers that failed together
// do not retry together.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	d := p.InitialBackoff
	for i := 1; i < attempt && d < p.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.MaxBackoff)
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// decide maps a failed attempt to what happens next: the outcome to report
// if no further attempt is made, and whether to try again in process.
func (p *Processor[TTx]) decide(ctx context.Context, err error, attempt int) (Outcome, bool) {
	switch {
	case stopAll(ctx, err):
		// The commit may have happened, or the caller gave up: leave the
		// message to the broker, whose redelivery finds the marker or redoes
		// the work.
		return Retry, false
	case classify(p.store, err) == ClassPermanent:
		return DeadLettered, false
	case attempt >= p.cfg.Retry.MaxAttempts:
		return Retry, false
	}
	return Retry, true
}
