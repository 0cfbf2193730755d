package idem

import (
	"context"
	"fmt"
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
	// WaitUnavailable is how long the processor keeps retrying, with
	// backoff, while the inbox database is unreachable (errors of class
	// ClassUnavailable from the store's own BEGIN, claim or COMMIT), without
	// spending the message's attempts: an outage is not the message's fault,
	// and spending its budget would dead-letter healthy messages. A handler
	// that cannot reach another service spends attempts as usual. After that the outcome is Retry wrapping
	// [ErrUnavailable]. Defaults to 1 minute. -1 waits until the context ends.
	WaitUnavailable time.Duration
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
	if p.WaitUnavailable == 0 {
		p.WaitUnavailable = time.Minute
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

// retrier is the retry policy applied to one message: the one place that
// decides, after a failed transaction, whether to try again, how long to
// wait, and what to report when giving up.
type retrier struct {
	policy    RetryPolicy
	class     func(error) ErrorClass
	attempt   int       // the message's tries so far, against MaxAttempts
	downSince time.Time // start of the current database outage
	waits     int       // tries during that outage, for its backoff
}

// next is called after a failed try. It returns the outcome to report if no
// further try is made, the error to report, and whether to try again (after
// wait).
func (r *retrier) next(ctx context.Context, err error) (o Outcome, rerr error, again bool, wait time.Duration) {
	r.attempt++
	switch {
	case stopAll(ctx, err):
		// The commit may have happened, or the caller gave up: leave the
		// message to the broker, whose redelivery finds the marker or redoes
		// the work.
		return Retry, err, false, 0
	case r.class(err) == ClassPermanent:
		return DeadLettered, err, false, 0
	case r.class(err) == ClassUnavailable && fromStore(err):
		// Not the message's fault: wait for the database without spending
		// the message's budget, up to WaitUnavailable.
		if r.downSince.IsZero() {
			r.downSince = time.Now()
		}
		down := time.Since(r.downSince)
		if w := r.policy.WaitUnavailable; w >= 0 && down >= w {
			return Retry, fmt.Errorf("%w for %v: %w", ErrUnavailable, down.Round(time.Second), err), false, 0
		}
		r.attempt--
		r.waits++
		return Retry, err, true, r.policy.Backoff(r.waits)
	}
	r.downSince, r.waits = time.Time{}, 0
	if r.attempt >= r.policy.MaxAttempts {
		return Retry, fmt.Errorf("%w after %d attempts: %w", ErrRetriesExhausted, r.attempt, err), false, 0
	}
	return Retry, err, true, r.policy.Backoff(r.attempt)
}
