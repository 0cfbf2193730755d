package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/logfmt"
)

// Backoff is a capped exponential backoff, the one every part of idem paces
// its tries with: the wait before try n+1 is Initial doubled n-1 times, at
// most Max. A zero field takes the default of the config that holds it
// (each config's field says which); Validate refuses a negative Initial
// and a Max below Initial.
type Backoff struct {
	// Initial is the first wait.
	Initial time.Duration
	// Max caps every wait.
	Max time.Duration
}

// Step returns the wait after n failures (n ≥ 1) without jitter: Initial
// doubled n-1 times, capped at Max, and never negative.
func (b Backoff) Step(n int) time.Duration {
	d := b.Initial
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	return max(min(d, b.Max), 0)
}

// Delay returns Step(n) with jitter, uniformly between half of it and all
// of it, so that consumers that failed together do not try again together.
func (b Backoff) Delay(n int) time.Duration {
	d := b.Step(n)
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// WithDefaults returns b with each zero field taken from def.
func (b Backoff) WithDefaults(def Backoff) Backoff {
	if b.Initial == 0 {
		b.Initial = def.Initial
	}
	if b.Max == 0 {
		b.Max = def.Max
	}
	return b
}

// Validate reports a range that cannot be used: a negative Initial, or a
// Max below Initial.
func (b Backoff) Validate() error {
	if b.Initial < 0 || b.Max < b.Initial {
		return fmt.Errorf("backoff %v..%v is not a valid range", b.Initial, b.Max)
	}
	return nil
}

// RetryPolicy is how the processor retries a transient failure in process
// before it gives the message back to the broker (outcome Retry). It is the
// only retry policy in idem; the adapters add only the broker's redelivery.
type RetryPolicy struct {
	// MaxAttempts is how many times the handler may run for one message
	// before the message is dead-lettered (wrapping [ErrRetriesExhausted]),
	// counting the first. The tries are made in place, with backoff; a try
	// whose commit outcome is unknown is given back to the broker and
	// counted, and the processor remembers the count when the message comes
	// back (in memory, for the 10,000 most recent such messages). A run in a
	// batch's shared transaction counts for the message whose handler failed
	// it, not for its neighbours; tries that are not the message's fault
	// (WaitUnavailable) do not count. Defaults to 5. 1 disables retries.
	MaxAttempts int
	// Backoff paces the tries in place: the wait before the second try is
	// Backoff.Initial, doubled for each further try up to Backoff.Max, with
	// jitter. Defaults to 20ms and 2s. Dispose takes its delays from it too.
	Backoff Backoff
	// WaitUnavailable is how long the processor keeps retrying, with
	// backoff, while the inbox database is unreachable (BEGIN or the claim
	// failing with an error of class ClassUnavailable, a connect timeout
	// included) or not set up for the consumer (ClassConfig: a missing
	// table or permission, in any step), without spending the message's
	// attempts: an outage is not its fault, and spending its budget would
	// dead-letter healthy messages. After that the outcome is a Retry
	// wrapping [ErrUnavailable] or [ErrMisconfigured], with Result.Blameless
	// set: adapters hold it and try again, never dead-letter it. Any other
	// failure, a handler that cannot reach another service included, spends
	// attempts as usual. Defaults to 1 minute. -1 waits until the context
	// ends.
	WaitUnavailable time.Duration
	// MaxContention is how many tries of one message in a row may fail on
	// contention met in its handler's own statements (a serialization
	// failure, a deadlock, a lock timeout: SQLSTATE 40001, 40P01, 55P03;
	// MySQL 1213, 1205; SQLite busy) without spending its attempts: such
	// contention usually ends when the other transaction does. After that,
	// every further try that fails on contention spends one of MaxAttempts
	// like any handler error, so a message whose transaction always
	// conflicts (a row another transaction never releases, a handler that
	// deadlocks with itself) is dead-lettered, wrapping [ErrContention],
	// instead of blocking its queue or partition for ever. The tries are
	// made in place, with backoff, and are not cut short by
	// WaitUnavailable. A claim that meets another transaction on its key
	// (the same message delivered twice) is not the message's contention
	// and stays blameless. Defaults to 10. -1 never charges contention: it
	// is then held like an outage (WaitUnavailable), for ever if it never
	// ends.
	MaxContention int
}

func (p *RetryPolicy) setDefaults() {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = 5
	}
	p.Backoff = p.Backoff.WithDefaults(Backoff{Initial: 20 * time.Millisecond, Max: 2 * time.Second})
	if p.WaitUnavailable == 0 {
		p.WaitUnavailable = time.Minute
	}
	if p.MaxContention == 0 {
		p.MaxContention = 10
	}
}

// verdict is what the retry policy decided after a failed try.
type verdict struct {
	outcome Outcome // reported if no further try is made
	err     error   // the error to report
	again   bool    // try again, after wait
	wait    time.Duration
	// blameless: the failure is not the message's doing (see
	// Result.Blameless).
	blameless bool
	// whole: a batch ends here as a whole, without trying its messages one
	// by one (the caller gave up, the database is down, or the batch
	// committed and only its ack is lost).
	whole bool
}

// retrier is the retry policy applied to one message or batch: the one
// place that decides, after a failed transaction, whether to try again, how
// long to wait, and what to report when giving up.
type retrier struct {
	policy    RetryPolicy
	class     func(error) idemstore.ErrorClass
	attempt   int       // tries so far that count against MaxAttempts
	downSince time.Time // start of the current outage
	waits     int       // tries during that outage, for its backoff
	// contention counts the tries in a row that failed on contention in
	// the handler's own statements (MaxContention).
	contention int
}

// next decides after a failed try. Only the message's own failures spend
// its attempts: the caller giving up, an unreachable database while the
// store began or claimed, and a database not set up for the consumer (a
// missing table, a missing permission) are waited out, blameless, and never
// end in a dead letter.
func (r *retrier) next(ctx context.Context, err error) verdict {
	var ac *afterCommitError
	switch {
	case ctx.Err() != nil:
		// The caller gave up (shutdown): not the message's doing.
		return verdict{outcome: Retry, err: err, blameless: true, whole: true}
	case errors.As(err, &ac):
		// Committed, then the process "died" before the ack (a fault
		// injected for drills): leave it to redelivery, as a crash would.
		r.attempt++
		return verdict{outcome: Retry, err: err, whole: true}
	case commitUnknown(err) && r.class(err) == idemstore.ClassUnavailable:
		// The server went away around the COMMIT (shut down, backend
		// terminated, connection refused): an outage. Trying again in place
		// is safe, since the claim decides: the marker is there (Duplicate)
		// or the work is redone.
		return r.wait(err, ErrUnavailable)
	case errors.As(err, new(*connLostError)):
		// The inbox's own connection died under the handler: an outage,
		// whatever the statement was.
		return r.wait(err, ErrUnavailable)
	case commitUnknown(err):
		// The commit may have happened: never Applied, never retried in
		// place. It counts against the message: a message whose commits
		// always end this way (a handler slower than the server's idle
		// timeout) must not loop. A batch then tries its messages one by
		// one, where each finds its marker (Duplicate) or redoes its work,
		// so the slow one is charged alone.
		r.attempt++
		if r.attempt >= r.policy.MaxAttempts {
			return verdict{outcome: DeadLettered, err: fmt.Errorf("%w after %d attempts: %w", ErrRetriesExhausted, r.attempt, err)}
		}
		return verdict{outcome: Retry, err: err}
	}
	class := r.class(err)
	switch {
	case class == idemstore.ClassPermanent:
		return verdict{outcome: DeadLettered, err: err}
	case class == idemstore.ClassConfig:
		return r.wait(fmt.Errorf("%w: %w", ErrMisconfigured, err), ErrMisconfigured)
	case class == idemstore.ClassBusy && storeStep(err) == "":
		// The handler's own statements met another transaction: waited
		// out, uncounted, for MaxContention tries in a row, then charged.
		err = fmt.Errorf("%w: %w", ErrContention, err)
		if r.policy.MaxContention < 0 {
			return r.wait(err, ErrContention)
		}
		if r.contention++; r.contention <= r.policy.MaxContention {
			r.downSince, r.waits = time.Time{}, 0
			return verdict{outcome: Retry, err: err, again: true, wait: max(r.policy.Backoff.Delay(r.contention), minOutageWait)}
		}
	case class == idemstore.ClassBusy:
		return r.wait(err, ErrBusy)
	case storeStep(err) != "" && storeStep(err) != stepCommit && class == idemstore.ClassUnavailable:
		// BEGIN, the claim and the lookups carry nothing of the message
		// but its validated key, so their failure proves an outage.
		return r.wait(err, ErrUnavailable)
	case storeStep(err) != "" && storeStep(err) != stepCommit:
		// A claim that times out on a lock, or deadlocks, meets another
		// transaction holding the key (the same message delivered twice,
		// a slow twin): its outcome decides this one, so wait for it
		// rather than dead-letter a healthy message. TxTimeout ends a hung
		// holder.
		return r.wait(err, ErrBusy)
	}
	if class != idemstore.ClassBusy {
		r.contention = 0
	}
	r.downSince, r.waits = time.Time{}, 0
	r.attempt++
	if r.attempt >= r.policy.MaxAttempts {
		return verdict{outcome: DeadLettered, err: fmt.Errorf("%w after %d attempts: %w", ErrRetriesExhausted, r.attempt, err)}
	}
	return verdict{outcome: Retry, err: err, again: true, wait: r.policy.Backoff.Delay(r.attempt)}
}

// wait waits out an outage without spending the message's budget, up to
// WaitUnavailable; then the batch or message ends in a blameless Retry
// wrapping sentinel.
func (r *retrier) wait(err, sentinel error) verdict {
	if r.downSince.IsZero() {
		r.downSince = time.Now()
	}
	down := time.Since(r.downSince)
	if w := r.policy.WaitUnavailable; w >= 0 && down >= w {
		if !errors.Is(err, sentinel) {
			err = fmt.Errorf("%w: %w", sentinel, err)
		}
		return verdict{outcome: Retry, err: fmt.Errorf("for %v: %w", down.Round(time.Millisecond), err), blameless: true, whole: true}
	}
	r.waits++
	// An outage is waited out at no less than minOutageWait between tries,
	// whatever the policy's backoff: a missing partition or a refused
	// connection fails at once, and a tight loop would only load the
	// database it waits for.
	return verdict{outcome: Retry, err: err, again: true, wait: max(r.policy.Backoff.Delay(r.waits), minOutageWait)}
}

// minOutageWait is the shortest wait between two tries during an outage.
const minOutageWait = 10 * time.Millisecond

// Action is what a broker adapter does with a delivery once the processor
// is done with it. Each adapter maps actions onto its broker's verbs in one
// table; the decision itself is made here, once, by [Processor.Dispose].
type Action int8

const (
	// ActionAck: the effect committed now (Applied) or before (Duplicate).
	// Ack the delivery, commit the offset.
	ActionAck Action = iota + 1
	// ActionRedeliver: the message was not applied and its try counted
	// against its budget (a commit whose outcome is unknown). Give it back
	// to the broker after Delay; the inbox settles it when it returns.
	ActionRedeliver
	// ActionHold: the message was not applied and it is not its fault (the
	// inbox database unreachable or misconfigured, a shutdown, a message
	// ahead of it in order, the consumer paused by an operator). Keep it
	// without spending any delivery budget of the broker's (no nack into a
	// quorum delivery limit, no DLQ) and try again after Delay.
	ActionHold
	// ActionDeadLetter: bad input, a permanent error, a message whose
	// retries are exhausted, or one older than the retention window. Send
	// it to the dead-letter destination with Reason; never ack it as
	// applied before the dead letter is durable.
	ActionDeadLetter
)

var actionNames = [...]string{"", "ack", "redeliver", "hold", "dead_letter"}

// String returns the lower-case name used in logs and metric labels.
func (a Action) String() string {
	if a < ActionAck || a > ActionDeadLetter {
		return "unknown"
	}
	return actionNames[a]
}

// Disposition is the one decision about a delivery: what to do, after
// how long, and why.
type Disposition struct {
	Action Action
	// Delay is how long to wait before the message is tried again
	// (Redeliver, Hold).
	Delay time.Duration
	// Reason says why a message is dead-lettered, redelivered or held; it
	// is Result.Err's text.
	Reason string
}

// Dispose turns a result into the disposition of its delivery. It is the
// only place that decides, for every adapter:
//
//   - Applied, Duplicate → Ack.
//   - DeadLettered, Expired → DeadLetter. The processor already spent the
//     message's budget: a handler error not marked permanent is retried in
//     place up to RetryPolicy.MaxAttempts runs, and only then dead-lettered.
//   - Retry marked Blameless (outage, misconfigured inbox, shutdown, not
//     attempted) → Hold after a backoff; nothing is spent. A message of a
//     paused consumer ([ErrPaused]) → Hold after [PauseHoldDelay].
//   - any other Retry (the commit outcome is unknown) → Redeliver after a
//     backoff; the try was counted, so a message whose commits always end
//     that way is dead-lettered once its budget is gone.
func (p *Processor[TTx]) Dispose(r Result) Disposition {
	d := Disposition{}
	if r.Err != nil {
		// One line: a driver's error may span several (DETAIL, HINT, one
		// line per address tried).
		d.Reason = logfmt.OneLine(r.Err.Error())
	}
	switch r.Outcome {
	case Applied, Duplicate:
		d.Action = ActionAck
	case DeadLettered, Expired:
		d.Action = ActionDeadLetter
	default:
		d.Action = ActionRedeliver
		if r.Blameless {
			d.Action = ActionHold
		}
		switch {
		case errors.Is(r.Err, ErrPaused):
			d.Delay = PauseHoldDelay
		case !errors.Is(r.Err, ErrNotAttempted):
			d.Delay = p.cfg.Retry.Backoff.Delay(max(r.Attempts, 1))
		}
	}
	return d
}
