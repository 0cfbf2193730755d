// Package sqlinbox is an idem inbox store on database/sql. Handlers receive
// the *sql.Tx that holds their message's claim, so database/sql and sqlc code
// runs in it unchanged. Two dialects are built in: [Postgres] (through the
// pgx stdlib driver) and [SQLite] (modernc.org/sqlite, pure Go, so a demo or
// a small service needs no database server).
//
// # Using it
//
// Open the database, create the store, migrate once at start-up, and hand
// the store to a processor:
//
//	db, err := sqliteinbox.Open("billing.db") // or sql.Open("pgx", url)
//	if err != nil { … }
//	store, err := sqlinbox.New(db, sqlinbox.SQLite, &sqlinbox.Config{Table: "idem_inbox"})
//	if err != nil { … }
//	if err := store.Migrate(ctx); err != nil { … }
//	proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
//		Consumer: "billing-invoice",
//		Key:      idem.ByMessageID,
//		Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
//			_, err := tx.ExecContext(ctx, `INSERT INTO invoices …`, …)
//			return err
//		},
//	})
//	res := proc.Process(ctx, msg) // Applied the first time, Duplicate after
//
// A team with a migration tool applies [DDL] (or `idem inbox ddl`) instead
// of calling Migrate; [Store.Check] (`idem inbox check`) verifies the table,
// and a consumer refuses to start on a problem it finds.
//
// # What it writes
//
// [Store.Migrate] creates the inbox table (consumer, key, message_id,
// body_sha256, event_time, processed_at, keep_until; primary key
// (consumer, key); indexes on processed_at and keep_until) from embedded,
// versioned migrations, records the version in idem_migrations and the
// layout and retention window in idem_inbox_settings next to it. The stored
// window is what [Store.Prune], [Store.Stats], processors and the CLI use;
// it changes only with [Store.SetWindow]. On PostgreSQL the tables and the
// bookkeeping are exactly those of package pgxinbox (plain layout; both
// stores run the same migrations from package internal/inboxdb), so a
// service can move between the two stores. Concurrent migrators wait for
// each other. On SQLite, times are stored as fixed-width UTC text
// (2006-01-02T15:04:05.000000Z) so that they sort and compare as text.
//
// keep_until is the later of a marker's write time and its message's event
// time, raised by [Store.Extend] when a later Duplicate carries a newer
// event time; the prune removes a marker only when its keep_until is past
// the window (package retention has the proof).
//
// [Store.Claim] inserts a whole batch of markers with one INSERT … ON
// CONFLICT (consumer, key) DO NOTHING RETURNING key: on PostgreSQL over
// arrays (unnest), on SQLite as rows split only when a batch would exceed
// the parameter limit. On PostgreSQL a concurrent
// claim of the same key waits on the primary key, bounded by lock_timeout; on
// SQLite writers queue for the database lock, bounded by busy_timeout (see
// sqliteinbox.Open for why every transaction there takes the lock at BEGIN).
//
// # Failures
//
// [Store.Commit] wraps [idem.ErrCommitUnknown] when PostgreSQL did not
// answer COMMIT, or answered by ending the session (a FATAL error): the
// transaction may have committed, so the message must not be acked.
// [Store.Classify] decides by driver error type and code, never by message
// text: SQLSTATE classes 22 and 23, and SQLite's constraint, mismatch and
// too-big codes, are permanent; everything else is worth another try.
package sqlinbox
