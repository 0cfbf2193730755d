// Package idembroker is the kit every broker adapter of idem is written
// against (idemrabbitmq and idemkafka are): the header contract, the
// dead-letter envelope, the broker hooks, one settle step, and the
// consumer's health with its HTTP probes. It holds what every adapter
// shares, so that an adapter holds only what its broker alone needs.
//
// # Writing an adapter
//
// An adapter turns deliveries into idem.Message values, hands them to an
// idem.Processor, and carries out on its broker the disposition the
// processor decides (idem.Result.Disposition). It decides nothing about a
// message itself. With this kit and the adapter suite (package
// adaptertest), an adapter for a new broker is written in these steps:
//
//  1. Read a delivery into an idem.Message. The identity is a property the
//     producer set (AMQP message_id) or the [HeaderMessageID] header,
//     never a broker position that changes on redelivery. The event time
//     comes from idem.EventTime over the ID, the [HeaderEventTime] header
//     (read with [ParseEventTime]) and the broker's timestamp. Headers are
//     copied as strings.
//  2. Make one [Settler] per consumer with [NewSettler], from the
//     processor's name, the source (queue or topics), the processor's hooks
//     (idem.Processor.Hooks) followed by the adapter's own Config.Hooks,
//     and the logger. Its [Settler.Health] is the consumer's
//     [HealthState]: call Start and Stop around Run, Connect and Disconnect
//     as the broker session comes and goes, Begin and End around each
//     batch in the database, Unreachable and Reachable for the inbox check
//     at start, and Fail for a failure that does not end the session.
//  3. For each result, take the disposition the processor gave it
//     (idem.Result.Disposition, decided by idem.Processor.Dispose; call
//     Dispose again only after changing a result) and map its action to the broker's verbs in one table: Ack
//     acknowledges (commits the offset), Redeliver gives the message back
//     after the delay, Hold keeps it without spending any delivery budget,
//     DeadLetter writes the dead letter and acknowledges only once the
//     dead letter is durable.
//  4. A dead letter is the original message and its headers plus its
//     [Envelope]: [NewEnvelope] from the consumer, the origin, the result
//     and the disposition, written with [Envelope.Write] (counts as
//     integers where the broker has them). Tell the settler with
//     [Settler.DeadLetter] whether it was written; the dead-letter tools
//     read it back with [ReadEnvelope].
//  5. Once the broker was told, call [Settler.Settle]: the health records
//     the settlement and every [SettleHook] hears of it. Call
//     [Settler.Redelivered] for a delivery the broker flags as seen before
//     and [Settler.Reconnect] when a session ends and the consumer connects
//     again. An adapter never updates health or calls a hook itself.
//  6. Give the consumer a Health method that returns the state's Health
//     plus what only the adapter knows (in flight, lag), so that
//     [HandleHealth] serves its probes.
//  7. Run the adapter suite (adaptertest.Run) against a real broker.
//
// # Hooks
//
// One pattern serves every part of idem: a hook is any value (idem.Hook)
// in idem.Config.Hooks or an adapter's Config.Hooks, and it is called for
// each optional interface it implements: the processor's (idem.OutcomeHook,
// idem.AttemptHook, idem.TraceHook), the broker's here ([SettleHook],
// [DeadLetterHook], [RedeliveredHook], [ReconnectHook]), and an adapter's
// for events only its broker has (idemkafka.CommitHook). A package with
// hooks of its own declares each as a small interface with On-named methods
// and calls them with idem.Each.
//
// Faults for tests and drills are of one type, idem.FaultPoint; an
// adapter declares its own points (idemrabbitmq.BeforeSettle,
// idemkafka.BeforeOffsetCommit) as values of it.
//
// [RedactURL] and [RedactError] keep credentials out of the logs and errors
// of anything that connects to a broker or a database.
package idembroker
