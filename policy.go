package idem

import (
	"errors"
	"time"

	"github.com/idemkit/idem/internal/logfmt"
)

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
	// ahead of it in order). Keep it without spending any delivery budget of
	// the broker's (no nack into a quorum delivery limit, no DLQ) and try
	// again after Delay.
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
//     attempted) → Hold after a backoff; nothing is spent.
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
		if !errors.Is(r.Err, ErrNotAttempted) {
			d.Delay = p.cfg.Retry.Backoff(max(r.Attempts, 1))
		}
	}
	return d
}
