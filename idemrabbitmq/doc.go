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
// consumer (the process dies before it can decide anything) ends in the
// DLQ instead of looping:
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
//		URL:   "amqp://guest:guest@127.0.0.1:5672/",
//		Queue: topo.Queue, // dead letters go to billing.invoice.dlq
//	})
//	err = c.Run(ctx) // blocks; nil after a graceful shutdown on ctx cancel
//
// Run refuses to start when the inbox table is missing or not writable
// ([idem.Processor.Check]), or when the dead-letter destination cannot be
// made sure of.
//
// # What the broker is told
//
// The processor decides what becomes of each message
// ([idem.Processor.Dispose]): how many times the handler runs, how long a
// retry waits, what is dead-lettered. [VerbFor] is the consumer's one
// table from that decision to broker verbs: ack (after the commit), requeue
// after a delay (a commit whose outcome is unknown), hold (not the
// message's fault: the delivery stays unacked and is processed again after
// a delay, while intake pauses, so an outage spends no quorum delivery
// count), and dead letter. A multiple ack is sent only over deliveries
// that are all finished; a delivery still in the database, held, or whose
// dead letter is not confirmed yet is never covered.
//
// # Dead letters
//
// Dead letters are never dropped. Each is republished, persistent and with
// publisher confirms, to [Config.DeadLetterQueue] ("<queue>.dlq" by
// default; the consumer declares it at start when it is missing), or
// through [Config.DeadLetterExchange], whose route to the queue the
// consumer binds at start. The copy carries the original properties and
// headers plus x-idem-reason, x-idem-outcome, x-idem-consumer,
// x-idem-attempts and x-idem-origin, and the original is acked only once
// the broker confirmed the copy. A copy the broker returns (unroutable) or
// nacks stays unacked and is published again after a backoff. Dead letters
// go out on a connection of their own: a memory or disk alarm blocks
// publishing connections, and the consuming one keeps delivering and
// acking while the dead letters wait. The processor logs each dead letter
// once; the consumer adds no line of its own.
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
// One hook value serves the processor and the consumer: the consumer
// calls the processor's hooks (idem.Config.Hooks) for each settlement
// (idembroker.SettleHook), dead letter (idembroker.DeadLetterHook),
// redelivered delivery (idembroker.RedeliveredHook) and reconnect
// (idembroker.ReconnectHook). Package idemprom's Metrics implements
// them all:
//
//	m := idemprom.New(prometheus.DefaultRegisterer)
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{ /* ... */ Hooks: []idem.Hook{m}})
//	c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{ /* ... */ })
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
// (idembroker.RedeliveredHook), never used to decide; a quorum queue's
// x-delivery-count becomes [idem.Message].Attempt. The event time is the
// time inside a UUIDv7 ID, else the producer's [idembroker.HeaderEventTime] header,
// else the AMQP timestamp ([idem.EventTime]). See [Message].
//
// # Connection loss
//
// When the connection or channel dies (broker restart, network), batches
// in the database go on to their commit (for at most
// [Config.ShutdownGrace]) and the consumer forgets every delivery tag it
// held: a tag means nothing on a new channel, and acking it there would
// close that channel with 406 PRECONDITION_FAILED. It reconnects with backoff and consumes again; the
// broker redelivers what was not acked and the inbox sorts it out. Tests and
// drills can cause exactly this with [Consumer.DropConnection] or a
// [FaultFunc] at [BeforeSettle]. A FaultFunc may block: the demo holds a
// committed batch's acks by blocking there, then returns an error to cut
// the connection.
//
// # Clusters
//
// On a RabbitMQ cluster, consume a quorum queue (x-queue-type=quorum, as
// [DeclareQuorumWithDLQ] declares it), publish with publisher confirms,
// and give [Config.URLs] every node:
//
//	URLs: []string{"amqp://app:secret@rmq-1:5672/", "amqp://app:secret@rmq-2:5672/", "amqp://app:secret@rmq-3:5672/"},
//
// The consuming and the dead-letter connection are each on one node. When
// that node dies, the session ends as on any lost connection and the
// consumer reconnects to the next node of the list, round-robin, skipping
// the nodes that refuse; the broker returns the deliveries that were not
// acked, and the inbox turns those whose batch had committed into
// Duplicates. When the queue's leader dies and the consumer's node lives,
// the queue elects a new leader among the survivors and the consumer goes
// on, its deliveries still held and acked on the same channel. A quorum
// queue counts each return of a delivery in x-delivery-count (it becomes
// [idem.Message].Attempt): every loss of the consumer's connection spends
// one delivery of the queue's delivery limit for each message in flight.
//
// # Publishing
//
// [Publisher] publishes persistent messages with publisher confirms and
// refuses one without message_id; it is meant for tests, demos and tools.
package idemrabbitmq
