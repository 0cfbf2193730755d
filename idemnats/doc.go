// Package idemnats consumes NATS JetStream streams into an idem processor,
// so that each message's effect is applied exactly once however often
// JetStream delivers it. It is written on the canonical client,
// github.com/nats-io/nats.go/jetstream, through a durable pull consumer.
//
// The contract is the one of every idem adapter (docs/design.md):
//
//   - A message is acked only after the transaction that applied it
//     committed; a message whose commit met its marker (a Duplicate) is
//     acked too. A process that dies between the commit and the ack
//     leaves the message to redelivery after AckWait, and the inbox
//     turns it into a Duplicate.
//   - Batches: the consumer fetches up to BatchSize messages and hands
//     them to one ProcessBatch, one transaction.
//   - What becomes of each message is the processor's decision, mapped to
//     JetStream verbs in one table, [VerbFor]: Ack (DoubleAck with
//     Config.ConfirmAcks), NakWithDelay with the processor's backoff,
//     InProgress heartbeats while a message is held or its transaction
//     open, and a dead letter published to a dead-letter stream, its
//     PubAck waited for, before TermWithReason.
//   - An outage of the inbox database is held, never dead-lettered: the
//     messages stay with the consumer, kept alive by heartbeats, and are
//     processed again after the processor's delay; [Consumer.Health]
//     shows the hold.
//   - Dead letters are never dropped: Run checks (or creates) the
//     dead-letter stream at start, and a dead letter the server does not
//     take keeps its message alive until it does.
//   - Run refuses a durable that would discard messages: MaxDeliver set
//     (JetStream stops delivering such a message and puts it in no
//     dead-letter queue), acks not explicit, or an AckWait shorter than
//     the processing budget (two heartbeats); the error wraps [ErrConfig]
//     and names the numbers. It refuses, too, a stream or dead-letter
//     stream that keeps messages longer than the inbox window
//     (idem.Processor.Window), unless
//     [Config.AcceptReplayPastWindow]: a replay from it could reach
//     past the horizon, where markers are pruned.
//   - Identity comes from the producer: the Nats-Msg-Id header by default
//     (Config.IDHeader), never the stream sequence. Event time from a
//     UUIDv7 ID, then the x-event-time header, then the stream's time; a
//     header that is not a time is bad input (idem.ErrBadTime).
//     Headers, W3C traceparent included, reach the handler and the
//     tracing hooks.
//
// The adapter is written on the shared kit, package idembroker: one
// [idembroker.Settler] keeps its health and calls the hooks, dead letters
// carry the [idembroker.Envelope] (plus [HeaderSubject]), and its fault
// point is an idem.FaultPoint.
//
// JetStream dedupes Nats-Msg-Id at publish, within the stream's duplicate
// window (2 minutes by default); idem's inbox dedupes what comes after
// it, and every redelivery. Package outbox/natspub publishes an outbox
// with the ID set.
//
// Order: one consumer processes a stream in order, one batch at a time;
// see [Consumer].
//
// A first consumer, whole, is the package's NewConsumer example; its
// heart:
//
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
//		Consumer: "billing-invoice",
//		Key:      idem.ByMessageID,
//		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
//			_, err := tx.Exec(ctx, `INSERT INTO invoices (source_message_id, body) VALUES ($1, $2)`, m.ID, m.Body)
//			return err
//		},
//	})
//	c, err := idemnats.NewConsumer(proc, &idemnats.Config{
//		URL:                    "nats://127.0.0.1:4222",
//		Stream:                 "BILLING",
//		CreateDeadLetterStream: true, // BILLING_DLQ, on idem.dlq.BILLING
//	})
//	err = c.Run(ctx) // until ctx is cancelled
package idemnats
