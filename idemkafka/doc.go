// Package idemkafka consumes Kafka records into a database exactly once in
// effect, over franz-go. Kafka redelivers a record after a crash between the
// database commit and the offset commit, after a rebalance and after an
// offset reset; Kafka transactions cover only Kafka-to-Kafka. idemkafka pairs
// the group consumer with an [idem.Processor], whose inbox claim in the same
// transaction as the effect turns every redelivery into a counted duplicate.
//
// # Identity
//
// A record's identity is the producer's event ID, by default in the
// "idem-message-id" header ([DefaultIDHeader]; [Config.IDHeader] or
// [Config.ID] choose another place). Never the offset: a replay or a
// republish changes it. A record without an ID is dead-lettered by the
// processor (logged and counted like any other outcome) and goes to the
// dead-letter topic.
// Producers set the header with [NewRecord] or [Publish].
//
// # Consuming
//
// Bring your own client (TLS, SASL, timeouts) and append [GroupOptions],
// which disable auto-commit and block rebalances while a poll is processed:
//
//	cl, err := kgo.NewClient(append(myOpts, idemkafka.GroupOptions("billing", "invoices")...)...)
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
//		Consumer: "billing-invoice",
//		Key:      idem.ByMessageID,
//		Handler:  createInvoice, // runs in the claim's pgx.Tx
//	})
//	c, err := idemkafka.NewConsumer(cl, proc, &idemkafka.Config{})
//	err = c.Run(ctx) // blocks; nil after ctx is cancelled and the group was left
//
// [NewConsumer] refuses a client that could commit an offset on its own or
// across a rebalance ([ErrClientUnsafe]). [New] builds the client from a
// small [ClientConfig] instead.
//
// # What Run does
//
// Each poll is split by partition; each partition's records are applied in
// order, in batches of [Config.MaxBatch] sharing one transaction, partitions
// in parallel. A partition's offset is committed only after the records up to
// it committed in the database. The rebalance is held until every batch of
// the poll is settled and committed, so a revoked partition never has a
// batch in flight, no offset is committed by two members and none moves
// backwards. A commit the coordinator refuses while it moves, loads or
// completes a rebalance is sent again, within [Config.CommitTimeout], while
// the poll's rebalance is held and the partition is therefore still this
// member's; never once the coordinator says the member left the group. A
// partition's last commit that still failed after CommitTimeout (the
// coordinator away longer) is kept pending: Run wakes up without new
// records and sends it again between polls, with backoff, each try within
// CommitTimeout and with the rebalance still held, until it is accepted
// (logged at Info), a later commit of the partition is, the coordinator
// says the member left the group, or a rebalance revoked the partition
// (it may be another member's: the pending commit is dropped unsent, and
// the records are redelivered and found in the inbox). So an idle
// partition's committed offset, and its lag, do not stay behind its end
// after an outage of the coordinator. A partition that a rebalance left
// with this member keeps its pending commit only if the client shows it
// committed or consumed (its pending commit is dropped otherwise: the
// client gives no surer sign that the partition stayed). An offset at or
// below one already accepted from this consumer is not sent, however the
// client's position moved back (a record given up and fetched again, a
// rewind after a leader change).
//
// Before it takes a record, Run checks that the inbox can be used
// (idem.Processor.Check) and that the dead-letter topic of every consumed
// topic exists ([Config.CreateDeadLetterTopics] lets it create them), and
// refuses to start otherwise.
//
// # Failures
//
// The processor decides what becomes of a record (idem.Processor.Dispose);
// the consumer only maps that to Kafka, in one table (ack.go): Ack moves
// the offset on; DeadLetter produces the record to its dead-letter topic
// (default "<topic>.dlq", with headers [idembroker.HeaderReason], [idembroker.HeaderOutcome],
// [idembroker.HeaderConsumer], [idembroker.HeaderAttempts] and [idembroker.HeaderOrigin]), waits until all
// in-sync replicas have it, then moves the offset past it; Redeliver and
// Hold commit nothing past the record, wait the disposition's delay and run
// it again in place, alone. The consumer keeps no retry budget of its own:
// a handler error is retried inside the processor up to
// idem.RetryPolicy.MaxAttempts runs, then dead-lettered; a database outage
// or a missing inbox table is held, never dead-lettered, until the
// database is back or Run's context ends. A partition's fetching is paused
// while it has a batch in flight and the other partitions keep flowing.
// Batches are processed in order (idem's ProcessBatchInOrder): records
// after one that must be retried are not tried, and are never applied
// ahead of it.
//
// # Rebalances
//
// A rebalance waits until every batch of the poll is settled and committed
// (BlockRebalanceOnPoll), so no offset is committed by two members and none
// moves backwards. It is told when it waits (the OnPartitionsCallbackBlocked
// option [GroupOptions] sets): the consumer then stops retrying and starts
// no batch, lets the batches in flight go on for [Config.RebalanceGrace],
// cancels the rest, commits what settled and gives up every record it did
// not settle, rewinding its partition, so whoever owns it next runs it
// again. A poison or slow record, or an outage, holds a rebalance no longer
// than the grace plus one commit timeout, which NewConsumer keeps within
// half the rebalance timeout.
//
// Cancelling Run's context finishes the batches in flight (or leaves them to
// redelivery), commits, and leaves the group.
//
// # Drills
//
// [Consumer.Crash] and [Config.Faults] stop a consumer after its database
// commit and before its offset commit, the window that produces duplicates
// in production; a new member of the group then takes over. A [FaultFunc]
// may also block there, to hold a partition's offset commit while a drill
// restarts something. They exist for tests and drills only.
//
// # Metrics
//
// One hook list serves the processor and the consumer: the consumer calls
// the processor's hooks (idem.Config.Hooks) and its own ([Config.Hooks]) —
// idembroker.SettleHook and idembroker.DeadLetterHook, which package
// idemprom's Metrics implements, and this package's [CommitHook],
// [DataLossHook] and [RetryHook] for events only Kafka has. [Consumer.Stats] counts
// them too.
package idemkafka
