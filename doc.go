// Package idem makes message consumers safe to run twice: at-least-once
// delivery, exactly-once effects.
//
// Brokers redeliver. A crash after the database commit and before the ack
// (RabbitMQ basic.ack, a Kafka offset commit), a broker restart, a rebalance
// or a replay sends the same message again. idem guards every effect with a
// database constraint written in the same transaction as the effect, and
// adapters ack the broker only after that transaction committed.
//
// # The pieces
//
// A [Processor] is built from a store (package pgxinbox for pgx, sqlinbox for
// database/sql) and a [Config]: the consumer's name, its [KeyFunc] and its
// [Handler]. The handler receives the store's own transaction type, so
// existing pgx, sqlc or database/sql code runs in it unchanged:
//
//	store, _ := pgxinbox.New(pool, nil)
//	_ = store.Migrate(ctx)
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
//		Consumer: "ledger",
//		Key:      idem.ByMessageID,
//		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
//			_, err := tx.Exec(ctx, `UPDATE merchants SET balance = balance + 12500 WHERE id = 1`)
//			return err
//		},
//	})
//	res := proc.Process(ctx, msg) // Applied, then Duplicate on every redelivery
//
// For each message the processor opens a transaction, inserts the marker
// (consumer, key) with ON CONFLICT DO NOTHING, runs the handler only when
// the marker is new, and commits. The unique constraint, not a SELECT,
// decides races between two deliveries.
//
// # Outcomes
//
// [Applied] and [Duplicate] are acked. [Retry] is not: the broker redelivers
// it (a transient error outlived the [RetryPolicy], the commit outcome is
// unknown, or processing was cancelled). [DeadLettered] (bad input, a
// [Permanent] error, a handler panic) and [Expired] (older than the
// retention [Horizon]) go to the dead-letter path with their reason; they
// are never acked as applied.
//
// # Batches
//
// [Processor.ProcessBatch] puts many messages in one transaction: their
// claims go in one statement in sorted key order, so overlapping batches
// cannot deadlock. Set [Config.HandleBatch] to write all fresh messages with
// one statement too. When anything fails, the batch is retried message by
// message so one poison message cannot sink its neighbours.
//
// # Testing
//
// Package idemstore is the contract stores implement, and
// idemstore/storetest their conformance suite; package idemtest is
// the test kit for consumers (deliver twice, concurrently, crash after
// commit). Config.Faults injects failures at named points of the path.
package idem
