// Package adaptertest is the conformance suite of broker adapters: the
// checks every adapter (idemrabbitmq, idemkafka, the next one) passes
// against its real broker and the real PostgreSQL, so that "exactly-once
// effects" means the same on each. It is to adapters what package
// storetest is to stores.
//
// An adapter's tests give [Run] a [Harness]: how to make a fresh topic,
// publish to it, build a consumer of it over an [idem.Processor], and read
// its dead-letter destination; and [Features], what its broker promises:
//
//	func TestConformance(t *testing.T) {
//		adaptertest.Run(t, myHarness{})
//	}
//
// The suite owns the database side: each check gets a schema of its own
// (internal/pgtest: IDEM_DATABASE_URL, or the local server), a pgxinbox
// inbox, an effects table without a unique constraint, so that an effect
// applied twice shows as two rows, and a processor whose hooks record
// every outcome, failed try, settlement and dead letter. Outages are made
// the way production has them, by a proxy in front of PostgreSQL
// (internal/netfault) that stops answering or goes silent, with
// connect_timeout=1; no check injects an error whose class it chose.
//
// The checks, each a parallel subtest, most on the batch and the
// one-at-a-time path:
//
//   - SameIDTwice: one effect; the copies are Duplicates, acked.
//   - CrashAfterCommit: the processor fails once after COMMIT
//     (idem.AfterCommit); the redelivery meets its marker.
//   - CrashBeforeAck, SettledOnce: the adapter's own fault point between
//     commit and ack; one effect each, and settlements reported only for
//     what reached the broker.
//   - MissingID: dead-lettered with a reason, never applied.
//   - Poison: a Permanent error is dead-lettered once, with x-idem-reason,
//     -consumer, -attempts, -outcome and -origin; the neighbours applied.
//   - TransientExhausted: dead-lettered after exactly RetryPolicy.MaxAttempts
//     runs of the handler in transactions of its own.
//   - Expired: older than the window, dead-lettered as expired.
//   - TwoConsumers: copies raced by two consumers, one effect each.
//   - Outage*: the database stops or freezes between messages, under a
//     handler or under a COMMIT; nothing dead-lettered, all applied once.
//   - MissingInboxTable, InboxTableGone: refused at start; held, not
//     dead-lettered, while running.
//   - ShutdownDuringOutage, OutageAtStart: Run returns promptly and a later
//     consumer applies everything; an outage at start is waited for.
//   - NoDeadLetterDestination: Run refuses to start.
//   - Ordered (Features.Ordered): applied in publish order, a retried and a
//     dead-lettered message in the middle.
//   - PartitionedRepublish: on the partitioned inbox, the same UUIDv7 ID
//     republished with other timestamps has one effect.
//   - ConnectionCut (a [Cutter] consumer): the broker connection cut with a
//     batch in the database; nothing lost, nothing doubled.
//
// A check that fails because of a known bug of the adapter is listed in
// Features.Known and skipped with its description, until it is fixed.
package adaptertest
