package idem

import (
	"context"
	"errors"

	"github.com/idemkit/idem/idemstore"
)

// permanentError marks an error that no retry can fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix (a validation failure,
// an unknown customer). The message is dead-lettered with err at once instead
// of being retried. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked with
// [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Errors the processor reports in Result.Err.
var (
	// ErrCommitUnknown: the connection failed during COMMIT, so the effect
	// may or may not be durable. The message is left to redelivery, which
	// either finds the marker or redoes the work. Stores wrap it around a
	// failed commit whose outcome they cannot know; it is
	// [idemstore.ErrCommitUnknown].
	ErrCommitUnknown = idemstore.ErrCommitUnknown
	// ErrRetriesExhausted: a transient error outlived the retry budget.
	ErrRetriesExhausted = errors.New("retries exhausted")
	// ErrUnavailable: the database stayed unreachable for longer than
	// RetryPolicy.WaitUnavailable.
	ErrUnavailable = errors.New("database unavailable")
	// ErrBusy: the inbox kept failing for reasons that are not the
	// message's (a lock timeout on a key another transaction holds, a
	// deadlock) for longer than RetryPolicy.WaitUnavailable.
	ErrBusy = errors.New("inbox busy (key held by another transaction)")
	// ErrContention: the handler's own transaction failed on contention
	// with another transaction (a serialization failure, a deadlock, a
	// lock timeout), on more tries in a row than
	// RetryPolicy.MaxContention allows without spending attempts.
	ErrContention = errors.New("the handler's transaction met contention (serialization failure, deadlock or lock timeout)")
	// ErrMisconfigured: the database stayed not set up for the consumer (a
	// missing table or permission, class ClassConfig) for longer than
	// RetryPolicy.WaitUnavailable. Run the inbox migration (idem inbox
	// migrate) or grant the permission; held messages then go through.
	ErrMisconfigured = errors.New("database not set up for the consumer (missing table or permission)")
	// ErrNotAttempted: a message of a batch was not tried because an earlier
	// one must be retried first (order is kept).
	ErrNotAttempted = errors.New("not attempted")
	// ErrBatchFailed: the batch's transaction failed as a whole (its commit
	// outcome is unknown, or processing was cancelled), so no message of it
	// is known to be applied.
	ErrBatchFailed = errors.New("batch transaction failed")
)

// classify decides what to do with err: the one place that maps errors to
// retry decisions. Classes come from error types and SQLSTATE codes (through
// the store), never from message text.
//
// The store decides for every error but one marked [Permanent] and a
// configuration error of the processor's own (a horizon longer than the
// stored window): a context error is not the caller's shutdown unless the
// caller's context is done, which the retry policy checks first. A connect
// or read timeout is the database being unreachable, and the store says so.
func classify[TTx any](s idemstore.Store[TTx], err error) idemstore.ErrorClass {
	var hd *handlerDeadlineError
	switch {
	case IsPermanent(err):
		return idemstore.ClassPermanent
	case errors.Is(err, ErrConfig):
		return idemstore.ClassConfig
	case errors.As(err, &hd):
		// A deadline of the handler's own: the store would read the
		// timeout, or the connection the driver closed for it, as an
		// outage.
		return idemstore.ClassTransient
	}
	return s.Classify(err)
}

// handlerDeadlineError is a handler's failure on a deadline or a
// cancellation of its own (a query bounded by its own context), while the
// transaction's context was live: the message's failure, which spends its
// attempts, though drivers close the connection when such a deadline
// fires.
type handlerDeadlineError struct{ err error }

func (e *handlerDeadlineError) Error() string { return e.err.Error() }
func (e *handlerDeadlineError) Unwrap() error { return e.err }

// ownDeadline reports whether a handler's err is a context's deadline or
// cancellation.
func ownDeadline(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// Names of the store's steps, as they appear in errors.
const (
	stepBegin  = "beginning transaction"
	stepClaim  = "claiming inbox keys"
	stepLookup = "looking up duplicate markers"
	stepCommit = "committing"
	stepExtend = "extending markers"
	// stepPositions records the positions of log-broker sources.
	stepPositions = "recording positions"
	// stepSettings reads the inbox's stored settings.
	stepSettings = "reading inbox settings"
)

// storeError is a failure of one of the store's own steps (begin, claim,
// lookup, commit), named so that a dead letter's reason says where it
// failed, and so that the retry policy can tell the store's failures from
// the handler's.
type storeError struct {
	step string
	err  error
}

func (e *storeError) Error() string { return e.step + ": " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

func wrapStep(step string, err error) error { return &storeError{step: step, err: err} }

func storeStep(err error) string {
	var se *storeError
	if errors.As(err, &se) {
		return se.step
	}
	return ""
}

// connLostError is a handler's failure on a transaction whose connection
// is gone (see [idemstore.Store.Broken]).
type connLostError struct{ err error }

func (e *connLostError) Error() string {
	return "inbox connection lost: " + e.err.Error()
}
func (e *connLostError) Unwrap() error { return e.err }

// commitUnknown reports whether err is the store saying that a COMMIT's
// outcome is unknown (not a handler's error that happens to wrap the
// sentinel).
func commitUnknown(err error) bool {
	return storeStep(err) == stepCommit && errors.Is(err, ErrCommitUnknown)
}
