// Package idemrabbitmq consumes a RabbitMQ queue into an [idem.Processor]:
// at-least-once delivery, exactly-once effects.
//
// A broker restart requeues every delivery that was not acknowledged yet,
// including those whose effect already committed: in the incident idem was
// built from, 3,100 messages came back and 1,247 customers were invoiced
// twice. The [Consumer] makes that harmless. Each batch of deliveries is
// claimed in the inbox and applied in one database transaction, and the
// broker is acked only after the commit; a redelivery finds its marker and
// is acked as a Duplicate without touching anything.
//
// # Topology
//
// Declare a durable quorum queue with a dead-letter exchange, a dead-letter
// queue and a delivery limit, so that a message that keeps crashing the
// consumer ends in the DLQ instead of looping or being lost:
//
//	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, "billing.invoice", nil)
//
// # Consuming
//
// Build the processor with the effect's key and handler, then the consumer:
//
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
//		Consumer: "billing-invoice",
//		Key:      idem.ByMessageID,
//		Handler:  createInvoice, // func(ctx, tx pgx.Tx, m idem.Message) error
//	})
//	c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{
//		URL:                "amqp://guest:guest@127.0.0.1:5672/",
//		Queue:              topo.Queue,
//		DeadLetterExchange: topo.DeadLetterExchange, // reasons in x-idem-reason
//	})
//	err = c.Run(ctx) // blocks; nil after a graceful shutdown on ctx cancel
//
// # What the broker is told
//
// [VerbFor] is the one place that maps outcomes to broker verbs: Applied
// and Duplicate are acked (after the commit); Retry is nacked with requeue
// after a backoff (unless it is not the message's fault, below);
// DeadLettered and Expired are rejected without requeue, so the queue's
// dead-letter exchange receives them, or, with [Config.DeadLetterExchange],
// republished there with their reason (publisher confirms) and then acked. A multiple ack is sent only over deliveries that
// are all finished; a delivery still in the database is never covered.
//
// Nothing loops forever: a message whose deliveries keep ending in Retry of
// its own making is dead-lettered after [Config.MaxAttempts] (default 10)
// with a reason wrapping [idem.ErrRetriesExhausted], even on a classic
// queue, which has no delivery limit. A Retry that is not the message's
// fault (marked Blameless: the inbox database unreachable) neither counts
// nor requeues: the delivery is held unacked and
// processed again after a backoff while intake pauses, so an outage does
// not spend a quorum queue's delivery limit. See [Consumer.Run].
//
// # Workers and hot rows
//
// [Config.Workers] above 1 runs batches concurrently. When the messages
// touch the same hot rows (a balance, a stock level), concurrent batches
// queue on those rows' locks or deadlock and retry, and the extra workers
// cost throughput instead of adding it: keep one worker for such a
// consumer, or use a HandleBatch that writes the batch's rows in key
// order.
//
// # Metrics
//
// The processor's observer counts outcomes; [Hooks] adds what only the
// broker knows. To feed Prometheus' idem_redelivered_total from package
// idemprom, whose Metrics is the processor's observer and has
// Redelivered(consumer), a hooks adapter of a few lines does:
//
//	type promHooks struct {
//		idemrabbitmq.NopHooks
//		m        *idemprom.Metrics
//		consumer string
//	}
//
//	func (h promHooks) Redelivered(queue string) { h.m.Redelivered(h.consumer) }
//
//	m := idemprom.New(prometheus.DefaultRegisterer)
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{ /* ... */ Observer: m})
//	c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{
//		// ...
//		Hooks: promHooks{m: m, consumer: proc.Consumer()},
//	})
//
// The label is the consumer (the processor's name), as on every idem
// series, not the queue.
//
// # Identity
//
// The identity is the AMQP message_id property, or the header named by
// [Config.IDHeader]: an ID the producer assigned, stable across redeliveries.
// A message without one is dead-lettered, never applied unguarded. The
// redelivered flag is copied to [idem.Message].Redelivered and counted
// ([Hooks].Redelivered), never used to decide; a quorum queue's
// x-delivery-count becomes [idem.Message].Attempt. See [Message].
//
// # Connection loss
//
// When the connection or channel dies (broker restart, network), the
// consumer forgets every delivery tag it held: a tag means nothing on a new
// channel, and acking it there would close that channel with 406
// PRECONDITION_FAILED. It reconnects with backoff and consumes again; the
// broker redelivers what was not acked and the inbox sorts it out. Tests and
// drills can cause exactly this with [Consumer.DropConnection] or a
// [FaultFunc] at [BeforeSettle]. A FaultFunc may block: the demo holds a
// committed batch's acks by blocking there, then returns an error to cut
// the connection.
//
// # Publishing
//
// [Publisher] publishes persistent messages with publisher confirms and
// refuses one without message_id; it is meant for tests, demos and tools.
package idemrabbitmq
