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
// place where idem's outcomes meet Kafka: try is the number of the try that
// produced r, starting at 1.
func (c *Consumer[TTx]) actionFor(ctx context.Context, r idem.Result, try int) action {
	switch {
	case r.Outcome.Acked(): // Applied, Duplicate
		return advance
	case r.Outcome == idem.DeadLettered, r.Outcome == idem.Expired:
		return deadLetter
	case ctx.Err() != nil:
		// Retry caused by shutdown or a crash, not by the record: leave it to
		// redelivery rather than spend its budget or dead-letter it.
		return stop
	case try >= c.cfg.MaxAttempts:
		// A poison record holds its partition no longer than its budget.
		return deadLetter
	}
	return retry
}
