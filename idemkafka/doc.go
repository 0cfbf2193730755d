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
// backwards.
//
// Outcomes map to broker actions in one place (ack.go): Applied and Duplicate
// move the offset on; DeadLettered and Expired are produced to the
// dead-letter topic (default "<topic>.dlq", headers [HeaderError],
// [HeaderConsumer], [HeaderAttempts] and the original topic, partition and
// offset), then the offset moves past them; Retry backs off and tries the
// record again in place, pausing only its partition while the others keep
// flowing, and dead-letters it after [Config.MaxAttempts] tries. A poison
// record holds its partition no longer than that budget. Batches are
// processed in order (idem's ProcessBatchInOrder): records after one that
// must be retried are not tried, and are never applied ahead of it.
//
// Only failures that are the record's own count against MaxAttempts. What
// the processor marks Blameless — a database outage (idem.ErrUnavailable
// once the processor's WaitUnavailable is over) and records waiting behind
// an earlier one (idem.ErrNotAttempted) — backs off and tries again without
// counting, until the database is back or Run's context ends: an outage
// dead-letters nothing. A commit whose outcome is unknown counts, so a
// record whose commits always end that way cannot hold its partition
// forever.
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
// Outcomes are counted by the processor's idem.Observer; broker-side events
// (commits, retries, dead letters) reach an optional [Hooks].
package idemkafka
