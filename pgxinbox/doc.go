// Package pgxinbox is the PostgreSQL inbox of idem on pgx: the table whose
// primary key decides, inside the handler's own transaction, whether a
// message was already applied.
//
//	store, err := pgxinbox.New(pool, &pgxinbox.Config{Window: 14 * 24 * time.Hour})
//	err = store.Migrate(ctx)
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
//		Consumer: "ledger",
//		Key:      idem.ByMessageID,
//		Handler:  apply,
//		Horizon:  store.Horizon(), // the same window as the prune
//	})
//
// # Retention
//
// Markers cannot be kept forever, and forgetting one too early lets an old
// duplicate through. Two rules make it safe (package retention has the
// proof):
//
//   - The consumer's horizon guard refuses (outcome Expired, dead-lettered
//     by default) any message whose event time is older than the window
//     minus a skew margin: its marker may be gone, so it cannot be proven new.
//   - The prune removes a marker only when both its event time and its write
//     time are older than the window, by the database's clock.
//
// Give consumers [Store.Horizon] (or an idem.Horizon with the same Window)
// and run `idem inbox prune` (or [Store.Prune]) every hour or so, from as
// many instances as you like: one leads, the others skip. Messages need an
// event time (Message.Time) for the guard to judge them: a producer's time
// header, the time in a UUIDv7 message ID ([idem.TimeFromUUIDv7]), or the
// broker's timestamp when it is stable across redeliveries (a Kafka record's
// timestamp is; a republished copy's is not). A message without one passes
// the guard on the plain layout: its marker is kept a window after it was
// written, but a replay later than that is applied again.
//
// # Layouts
//
// [Plain] (the default) is one table, pruned by batched DELETE: simple, and
// fine up to some millions of markers a day. [Partitioned] partitions the
// table by day of event time and drops whole days: no per-row WAL, no dead
// tuples, no vacuum debt (see the README for measured figures). The
// partition column must be in the primary key, which is why it is the
// message's own time and never the time of processing: a message first
// processed at 23:59 and redelivered at 00:01 would otherwise land in two
// partitions and be applied twice. The partitioned layout therefore refuses
// messages without an event time (dead-lettered, [ErrNoEventTime]), and run
// `idem inbox partitions ensure` daily so that tomorrow's partition exists
// (a claim with no partition is retried, [ErrNoPartition]).
//
// # Choosing the window
//
// The window must cover the longest time after which the same message can
// come back, measured from its event time:
//
//   - Redelivery after a crash, a rebalance or a broker restart: minutes to
//     hours. Any window of days covers it.
//   - An outbox relay that stops and later publishes again: the longest
//     outage you tolerate before someone intervenes.
//   - A replay: a Kafka consumer group reset to the earliest offset rereads
//     everything the topic retains (retention.ms, 7 days by default), so the
//     window must exceed the topic's retention. A dead-letter queue that
//     operators replay must be replayed within the window: give the DLQ (its
//     x-message-ttl, or its topic's retention) a shorter life than the
//     window, or replay older messages knowingly with Horizon.ApplyExpired.
//   - Lag: a consumer that runs behind by L processes a message L after its
//     event time; the replay of it can come up to the topic retention after
//     that. Alerting on lag well below the window keeps the margin.
//
// Take the longest of these, add a margin (a day), and prefer a round number
// of days for the partitioned layout, where markers are kept up to a day
// longer than the window. Fourteen days, the default, covers a seven-day
// topic with a week to spare. A longer window costs only disk: markers are
// about 275 bytes each with their indexes (32-character keys, measured).
//
// # Metrics
//
// [Config.Hooks] receives markers pruned, partitions dropped and the age of
// the oldest marker (on [Store.Stats]); messages refused by the guard are
// counted by the processor's idem.Observer with outcome Expired.
package pgxinbox
