package idemredis

import "sync/atomic"

// Stats counts what a consumer did since it was created, on Redis's side;
// outcomes are also counted by the processor's observer.
type Stats struct {
	// Delivered counts entries run through the processor (an entry run
	// again counts again).
	Delivered uint64
	// Claimed counts entries taken over from idle consumers (XAUTOCLAIM).
	Claimed uint64
	// Applied and Duplicates count entries acked, by outcome.
	Applied, Duplicates uint64
	// Retried counts runs again of an entry whose try counted against its
	// budget (Redeliver); Held those that were not its fault (Hold: the
	// database unreachable or not set up).
	Retried, Held uint64
	// DeadLettered counts entries copied to the dead-letter stream and
	// acked.
	DeadLettered uint64
	// Acks counts XACKs Redis answered; AckErrors failed XACK calls (the
	// entries stay pending, to be taken over and found in the inbox).
	Acks, AckErrors uint64
	// Trimmed counts pending entries found deleted or trimmed from the
	// stream before they were acked: lost to every consumer.
	Trimmed uint64
}

type counters struct {
	delivered, claimed, applied, duplicates, retried, held atomic.Uint64
	deadLettered, acks, ackErrors, trimmed                 atomic.Uint64
}

// Stats returns the consumer's counters.
func (c *Consumer[TTx]) Stats() Stats {
	s := &c.stats
	return Stats{
		Delivered: s.delivered.Load(), Claimed: s.claimed.Load(),
		Applied: s.applied.Load(), Duplicates: s.duplicates.Load(),
		Retried: s.retried.Load(), Held: s.held.Load(),
		DeadLettered: s.deadLettered.Load(),
		Acks:         s.acks.Load(), AckErrors: s.ackErrors.Load(),
		Trimmed: s.trimmed.Load(),
	}
}
