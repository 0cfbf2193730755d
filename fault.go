package idem

import "context"

// FaultPoint names a place where a test or a drill can inject a failure or a
// crash: the processor's points below, and the broker adapters' own
// (idemrabbitmq.BeforeSettle, idemkafka.BeforeOffsetCommit), which are of
// this one type. Fault suites kill processes exactly there.
type FaultPoint string

const (
	// BeforeClaim: the transaction is open, nothing is written yet.
	BeforeClaim FaultPoint = "before_claim"
	// AfterClaim: the markers are inserted, the handler has not run.
	AfterClaim FaultPoint = "after_claim"
	// AfterHandler: the effect is written, COMMIT has not been sent.
	AfterHandler FaultPoint = "after_handler"
	// AfterCommit: the transaction committed; the broker has not been acked.
	// An error here is reported as Retry, which is exactly what a crash
	// between commit and ack looks like to the broker.
	AfterCommit FaultPoint = "after_commit"
)

// FaultFunc is called at every fault point with the messages in flight. A
// non-nil error is treated as if the step failed there; a panic simulates a
// crash. Nil (the default) costs nothing.
type FaultFunc func(ctx context.Context, point FaultPoint, msgs []Message) error
