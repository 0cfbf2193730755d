package idemkafka

import "sync/atomic"

// Stats counts what a consumer did since it was created, on the broker's
// side; outcomes are also counted by the processor's observer.
type Stats struct {
	// Delivered counts records taken from the client (a record given up at
	// a rebalance and fetched again counts again).
	Delivered uint64
	// Applied and Duplicates count records whose offset may move past them,
	// by outcome.
	Applied, Duplicates uint64
	// Retried counts runs in place of a record whose try counted against
	// its budget (the processor said Redeliver: a commit whose outcome is
	// unknown); Held counts runs in place that were not the record's fault
	// (Hold: the database unreachable or not set up, an earlier record
	// first).
	Retried, Held uint64
	// DeadLettered counts dead letters all in-sync replicas acknowledged.
	DeadLettered uint64
	// Commits counts offset commits the broker accepted; CommitErrors those
	// it refused or that timed out (their records are redelivered and
	// found in the inbox). CommitRetries counts commits sent again after
	// the coordinator refused them while it moved, loaded or completed a
	// rebalance, and the re-sends between polls of a partition's last
	// commit that still failed after CommitTimeout (one per partition per
	// re-send; one that lands counts in Commits too).
	Commits, CommitErrors, CommitRetries uint64
	// DataLosses counts the client's reports of a partition's log that
	// ends below what it had consumed (see [DataLossHook]).
	DataLosses uint64
	// Rebalances counts rebalances that waited for this consumer; at each
	// it stopped retrying and gave up the records it had not settled.
	Rebalances uint64
	// GivenUp counts records given up at a rebalance or a shutdown, to be
	// run again by whoever owns their partition next.
	GivenUp uint64
	// Rewinds counts partitions consumed again from the database's
	// position because it was behind the broker's committed offset
	// (Config.Positions); Rewound counts the records between the two.
	// Refusals counts partitions refused for the same reason.
	Rewinds, Rewound, Refusals uint64
}

type counters struct {
	delivered, applied, duplicates, retried, held, deadLettered atomic.Uint64
	commits, commitErrors, commitRetries, rebalances, givenUp   atomic.Uint64
	dataLosses, rewinds, rewound, refusals                      atomic.Uint64
}

// Stats returns the consumer's counters.
func (c *Consumer[TTx]) Stats() Stats {
	s := &c.stats
	return Stats{
		Delivered:     s.delivered.Load(),
		Applied:       s.applied.Load(),
		Duplicates:    s.duplicates.Load(),
		Retried:       s.retried.Load(),
		Held:          s.held.Load(),
		DeadLettered:  s.deadLettered.Load(),
		Commits:       s.commits.Load(),
		CommitErrors:  s.commitErrors.Load(),
		CommitRetries: s.commitRetries.Load(),
		Rewinds:       s.rewinds.Load(),
		Rewound:       s.rewound.Load(),
		Refusals:      s.refusals.Load(),
		DataLosses:    s.dataLosses.Load(),
		Rebalances:    s.rebalances.Load(),
		GivenUp:       s.givenUp.Load(),
	}
}
