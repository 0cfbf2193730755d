// Package idemredis consumes Redis Streams with exactly-once effects: a
// [Consumer] reads a stream as a member of a consumer group
// (XREADGROUP, BatchSize entries at a time, each batch one
// idem.Processor.ProcessBatchInOrder) and tells Redis about an entry only
// after its effect committed in the database (docs/design.md 4).
//
// What the consumer does with an entry is the processor's decision
// (idem.Result.Disposition), mapped to Redis verbs in one table, [VerbFor]:
//
//	ack          → XACK, after the COMMIT; one XACK per batch
//	redeliver    → leave it pending, run it again after the delay
//	hold         → leave it pending (the database is away: nothing spent)
//	dead_letter  → one Lua script: XADD to the dead-letter stream with its
//	               idembroker.Envelope, then XACK; atomic on the server
//
// Redis's own facts, and what the consumer does about them:
//
//   - The pending list is the only lease. An entry stays pending with the
//     consumer that read it until it is acked; one that died leaves its
//     entries there, and a running consumer takes them over with
//     XAUTOCLAIM once they were idle for Config.ClaimIdle. A running
//     consumer keeps the entries in hand from going idle (XCLAIM JUSTID),
//     however long their transaction or retry takes.
//   - The group's delivery counter is the only attempt count:
//     idem.Message.Attempt is that counter (plus the runs again in
//     place), and a dead letter carries it as x-idem-deliveries.
//   - There is no dead-letter stream of Redis's own. Config.DeadLetterStream
//     (the stream's name + ".dlq") is checked at start; a consumer whose
//     dead letters would have nowhere to go refuses to start
//     ([ErrDeadLetterStream]), and a dead letter whose stream went away
//     stays pending, holding the stream, until it is back.
//   - Trimming (XADD MAXLEN/MINID, XTRIM) can delete entries no group has
//     read, and pending entries with them. [Consumer.Durability] reports
//     entries deleted past the group's position; pending entries found
//     deleted are counted (Stats.Trimmed), logged as lost and acked.
//   - Redis has no time retention: a stream keeps its entries until they
//     are trimmed, and a group moved back (XGROUP SETID) or restored
//     delivers them again. Run refuses a stream whose first entry, or
//     whose declared retention (Config.MaxAge), is older than the inbox
//     window (idem.Processor.Window), naming both ([ErrConfig]), unless
//     Config.AcceptReplayPastWindow accepts it.
//   - Deleting a consumer drops its pending entries: [DeleteConsumer]
//     refuses while it has any.
//   - Replication is asynchronous and appendfsync may be lazy:
//     [Consumer.Durability], logged at start, says what a crash or a
//     failover can lose. An ack undone is harmless (the entry comes back
//     and meets its marker); an entry or a dead letter lost is not.
//
// An entry's fields, named as package idembroker names headers: the message
// ID (Config.IDField, "idem-message-id"), the body ("body"), the event time
// ("x-event-time"), the key ("key"); every
// other field, the W3C trace context (traceparent, tracestate) among them,
// is in idem.Message.Headers. The entry ID is a delivery's address, never
// the message's identity: a republish gets another. An entry without an ID,
// or with an event time that does not parse (idem.Message.TimeErr), is
// dead-lettered by the processor with the reason. Health and the broker
// hooks go through one idembroker.Settler, as on every broker.
//
// One consumer of a stream applies its entries in stream order: a batch
// stops at an entry to run again, which then runs alone. Several consumers
// of one group share the stream and give up that order; the inbox keeps
// the effects exactly once either way.
//
// Run stops when its context is cancelled: the batch in hand is finished
// or rolled back, what committed is acked (within Config.AckTimeout), the
// rest stays pending for whoever comes next; a consumer with nothing
// pending then leaves its group (XGROUP DELCONSUMER), so that names do not
// pile up with restarts.
package idemredis
