package idemkafka

import (
	"context"

	"github.com/idemkit/idem"
)

// action is what the consumer does on the broker side with one record.
type action int

const (
	// advance: the effect is durable (or was already): the offset may move
	// past the record.
	advance action = iota + 1
	// deadLetter: produce the record to the dead-letter topic, then move the
	// offset past it.
	deadLetter
	// retry: back off and try the record again in place, holding only its
	// partition.
	retry
	// stop: the consumer is shutting down or crashing: commit nothing past
	// the record, so the next owner of the partition gets it again.
	stop
)

// actionFor maps a processor outcome to the broker's verbs. It is the one
// place where idem's outcomes meet Kafka: tries is the number of tries of the
// record that count against MaxAttempts, including the one that produced r
// when [spends] says it counts.
func (c *Consumer[TTx]) actionFor(ctx context.Context, r idem.Result, tries int) action {
	switch {
	case r.Outcome.Acked(): // Applied, Duplicate
		return advance
	case r.Outcome == idem.DeadLettered, r.Outcome == idem.Expired:
		return deadLetter
	case ctx.Err() != nil:
		// Retry caused by shutdown or a crash, not by the record: leave it to
		// redelivery rather than spend its budget or dead-letter it.
		return stop
	case !spends(r):
		// Not the record's fault: wait for the database (or for the record
		// before it) as long as the consumer runs.
		return retry
	case tries >= c.cfg.MaxAttempts:
		// A poison record holds its partition no longer than its budget.
		return deadLetter
	}
	return retry
}

// spends reports whether the try that produced r counts against the record's
// MaxAttempts: every outcome does except a Retry the processor marks
// Blameless (the inbox database was unreachable at BEGIN, processing was
// cancelled, or an earlier record must be retried first). Counting those
// would dead-letter healthy records during an outage; counting the rest
// (an unknown commit included) keeps any record from looping forever.
func spends(r idem.Result) bool { return r.Outcome != idem.Retry || !r.Blameless }
