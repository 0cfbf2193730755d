// Package pgxinbox is the PostgreSQL inbox of idem on pgx: the table whose
// primary key decides, inside the handler's own transaction, whether a
// message was already applied.
//
//	store, err := pgxinbox.New(pool, &pgxinbox.Config{Window: 14 * 24 * time.Hour})
//	err = store.Migrate(ctx) // stores the window with the table, once
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
//		Consumer: "ledger",
//		Key:      idem.ByMessageID,
//		Handler:  apply,
//	}) // guards with the stored window
//
// # Migration tools
//
// A team that runs its schema changes through golang-migrate, goose, Atlas
// or Flyway applies [DDL] (or `idem inbox ddl --format …`, which writes the
// tool's files) instead of calling Migrate: the same SQL, rendered from the
// same migration files, with the schema version and the settings row, and
// safe to run again. Either way, [Store.Check] (`idem inbox check`) says
// what is wrong with a table and how to fix it, and a consumer runs it
// before its first message and refuses to start on a problem.
//
// # Retention
//
// Markers cannot be kept forever, and forgetting one too early lets an old
// duplicate through. Package retention has the proof; in short:
//
//   - The window is stored with the table (idem_inbox_settings, written by
//     [Store.Migrate] from Config.Window, 14 days by default). Processors,
//     [Store.Prune], [Store.DropPartitions], [Store.Stats] and every
//     `idem inbox` command read it; a prune shorter than it is refused, and
//     it changes only with [Store.SetWindow] (`idem inbox window set`),
//     which logs the change and refuses to go under an hour or below a
//     consumer's recorded horizon unless forced.
//   - The consumer's horizon guard refuses (outcome Expired, dead-lettered
//     by default) any message whose event time is older than the window
//     minus a skew margin: its marker may be gone, so it cannot be proven new.
//   - Each marker has a keep_until: the later of its write time and its
//     message's event time, raised by every later Duplicate with a newer
//     event time ([Store.Extend]). The plain layout's prune removes a marker
//     only when its keep_until is older than the window, by the database's
//     clock, in batches driven by the keep_until index.
//
// Run `idem inbox prune` (or [Store.Prune]) every hour or so, from as many
// instances as you like: one leads, the others skip. Messages need an event
// time (Message.Time) for the guard to judge them: the time in a UUIDv7
// message ID, a producer's time header, or the broker's timestamp, in that
// order of stability. A message without one passes the guard on the plain
// layout: its marker is kept a window after it was written, but a replay
// later than that is applied again.
//
// # Layouts
//
// [Plain] (the default) is one table, pruned by batched DELETE: simple, and
// fine up to some millions of markers a day. [Partitioned] partitions the
// table by day of partition time and drops whole days: no per-row WAL, no
// dead tuples, no vacuum debt (see docs/performance.md for measured figures). The
// partition column must be in the primary key, which is why it is a
// function of the key alone, and never the time of processing or a
// timestamp a copy of the message carries: a message first processed at
// 23:59 and redelivered at 00:01, or republished with a fresh timestamp,
// would otherwise land on another key and be applied twice. The processor
// derives it (idemstore.Claim.PartitionTime): by default the time inside a
// UUIDv7 message ID, or Config.PartitionTime for a business key that names
// its period. A claim without one is refused (dead-lettered,
// idem.ErrNoPartitionTime), and the guard also expires a message whose
// partition time is older than the window. Run `idem inbox partitions
// ensure` daily so that tomorrow's partition exists (a claim with no
// partition is retried, [ErrNoPartition]).
//
// Tables of the previous release are upgraded in place by Migrate: the
// partition column event_time is renamed partition_time (PostgreSQL renames
// a partition key column without moving a row), so markers written before
// keep the event time they were partitioned by as their partition time;
// for UUIDv7 message IDs that is the same time the processor now derives.
// Markers of messages whose event time came from elsewhere (a header, the
// broker) are met only by a copy whose partition time happens to agree,
// until they age out: upgrade such a consumer to UUIDv7 IDs or a
// Config.PartitionTime that matches, or drain it before upgrading.
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
// longer than the window. Lengthening the stored window later is safe for
// what is written from then on; markers older than the old window may be
// gone already. Fourteen days, the default, covers a seven-day
// topic with a week to spare. A longer window costs only disk: markers are
// about 275 bytes each with their indexes (32-character keys, measured).
//
// # Metrics
//
// [Config.Hooks] receives markers pruned, partitions dropped and the age of
// the oldest marker (on [Store.Stats]), labelled with the table's name as
// written, as sqlinbox labels them; messages refused by the guard are
// counted by the processor's idem.OutcomeHook with outcome Expired.
//
// The SQL is in package internal/inboxdb, one file per dialect, shared with
// sqlinbox: the migrations, the claim, the prune and the settings.
package pgxinbox
