// Package outbox is a transactional outbox and its relay: the events a
// consumer's effect emits commit in the same transaction as the effect,
// and a relay publishes what was committed, so a pipeline built with idem
// is exactly-once in effect from end to end.
//
//	consume → effect + Enqueue (one transaction) → Relay → broker → the next idem consumer
//
// # Enqueue
//
// [Outbox.Enqueue] writes messages inside the caller's transaction — in an
// idem handler, the handler's own pgx.Tx or *sql.Tx — so they are
// published once it commits and never if it rolls back. Each message gets
// a UUIDv7 ID at enqueue: the publishers send it as the message ID
// (RabbitMQ message_id, Kafka header idem-message-id), stable across every
// republish, so the downstream inbox skips a duplicate; its time is the
// event time (sent in the x-event-time header too), which the downstream
// consumer's horizon and partitioning read from the ID alone.
//
// # The relay and its order
//
// A [Relay] reads committed rows, hands them to a [Publisher] in batches,
// and marks each row sent only after the broker confirmed it. It never
// holds a database transaction open while it waits for the broker: it
// reads with a plain query, publishes, then marks in one short
// transaction. A crash between publish and mark republishes the same IDs,
// which the downstream inbox skips.
//
// Messages with the same key are published in commit order; different
// keys flow in parallel. Three pieces make that hold with several relays:
//
//   - Commit order is seq order per key. On PostgreSQL, Enqueue takes a
//     transaction-scoped advisory lock on the hash of each key before it
//     inserts, so a second transaction enqueueing the same key waits for
//     the first to end and takes a later seq. SQLite has one writer at a
//     time. Rows without a key are not ordered.
//   - Rows are spread over a fixed number of shards (hash of the key
//     modulo Config.Shards, stored with the table). A relay publishes only
//     the shards it holds a lease on (the <table>_leases table: owner,
//     epoch, expiry), renewed every third of the lease term and shared
//     fairly among the live relays (<table>_relays), and reads the unsent
//     rows of its shards together, in seq order.
//   - The marking transaction first checks that the leases are still this
//     relay's (owner and epoch, not expired; on PostgreSQL it also locks
//     them against a takeover until it commits). A relay that stalled past
//     its lease term marks nothing of the shards it lost and starts no new
//     publish of them (a publish already under way may still end after the
//     lease did: its copies are duplicates); the new holder republishes the
//     unmarked rows, in order, and the downstream inbox skips the copies.
//
// The relay wakes on LISTEN/NOTIFY on PostgreSQL (Enqueue notifies in the
// caller's transaction, which PostgreSQL delivers on commit) and polls as a
// fallback (RelayConfig.PollInterval); on SQLite it polls, and relays of
// the same Outbox value are woken in process.
//
// # Failures
//
// A record the broker refuses (unroutable, too large, unknown topic: the
// publisher marks it with [Refused]) is tried again after a growing delay,
// up to RelayConfig.MaxAttempts, then parked with its reason: counted in
// [Outbox.Stats], listed by [Outbox.ParkedRows], reported to the hooks.
// Other keys keep flowing meanwhile; later rows of the refused row's key
// wait while it is retried, and flow past it once it is parked (unless
// RelayConfig.StrictOrder). [Outbox.Retry] sends parked rows again.
//
// A broker or database that cannot be reached is an outage: nothing is
// marked or parked, no attempt is counted, and the relay waits with
// jittered exponential backoff (RelayConfig.OutageBackoff).
//
// # Operations
//
// Sent rows are kept (sent_at) until [Outbox.Prune] deletes them in
// batches after a retention (7 days by default). [Outbox.Stats] gives the
// unsent count, the oldest unsent row's age, the parked and sent counts,
// per destination. The CLI has idem outbox stats, retry, prune and
// migrate.
package outbox
