// Package idemtest proves, against a real database, that a codebase's
// message consumers are safe to run twice, and ranks the damage of the
// legacy ones that are not.
//
// A broker delivers at least once: after a restart it redelivers every
// unacked message, so each consumer meets the same message twice. Only a
// test on a real database shows what that does, since the unique constraint
// is the thing under test; an in-memory fake has none and passes
// meaninglessly.
//
// # Checks
//
// Each check takes snapshots of the database ([Snapshotter]) around the
// deliveries and compares them as a whole ([Compare]), so a change nobody
// thought to assert on still shows. A failure names the table, the row
// (its primary key) and each column's value before → after:
//
//		ledger-credit is not idempotent: the second delivery of message evt-1 (outcome applied) changed the database:
//		  balances row account=acc-1 changed: balance 12500 → 25000
//
//	  - [DeliverTwice]: the second delivery is a Duplicate and changes nothing.
//	  - [DeliverConcurrently]: n racing deliveries leave the database as one
//	    delivery does (this is what catches "check, then insert").
//	  - [CrashAfterCommit]: the transaction commits, the ack is lost, the
//	    redelivery is a Duplicate and changes nothing.
//
// By default a check also fails when the first delivery changes nothing:
// such a test proves nothing. [AllowNoEffect] accepts it.
//
// A test for one consumer:
//
//	func TestInvoiceTwice(t *testing.T) {
//		pool := newSchema(t) // a fresh schema with the app's tables and a migrated inbox
//		store, _ := pgxinbox.New(pool, nil)
//		proc, _ := idem.NewProcessor(store, billing.InvoiceConfig())
//		snap := idemtest.Postgres(pool, &idemtest.SnapshotOptions{Ignore: []string{"updated_at"}})
//		idemtest.DeliverTwice(t, proc, billing.SampleRenewal(), snap)
//	}
//
// # Every consumer
//
// A [Suite] lists every consumer with a sample message and a [Setup] that
// builds it over a fresh database; [ForEachConsumer] runs the three checks
// on each. Given the names the application wires up, it also fails for a
// consumer that has no case, so a new consumer cannot ship without a test:
//
//	func TestEveryConsumerIsIdempotent(t *testing.T) {
//		var s idemtest.Suite[pgx.Tx]
//		s.Register("billing-invoice", idemtest.Case[pgx.Tx]{Sample: billing.SampleRenewal(), Setup: setup(billing.InvoiceConfig())})
//		s.Register("ledger-credit", idemtest.Case[pgx.Tx]{Sample: ledger.SampleCredit(), Setup: setup(ledger.CreditConfig())})
//		idemtest.ForEachConsumer(t, &s, app.ConsumerNames()...)
//	}
//
// # Legacy consumers
//
// For consumers written without idem, [Probe] delivers a sample twice and
// reports what the second delivery changed; [Plan] ranks the findings by
// declared [Severity] and measured damage into a fix plan, and [Ratchet]
// keeps the list of known offenders from growing: it fails when a consumer
// off the list is not idempotent, and when one on the list has been fixed
// (so it is removed and stays fixed).
//
// The kit depends on the standard testing package, database/sql and pgx;
// the snapshotters read PostgreSQL ([Postgres], [PostgresSQL]), SQLite
// ([SQLite]) and MySQL or MariaDB ([MySQL]). Effects outside the database
// (an email, an HTTP call) are invisible to them: record them in a fake that a [SnapshotFunc] reads, and
// merge it in with [Combine].
package idemtest
