// Package billing shows the reference services of the billing incident at
// work: the invoices service receiving a renewal three times (the first
// delivery, the broker's redelivery after a restart, and the producer's
// republish under another event ID) and writing one invoice and one charge;
// the ledger crediting a merchant once for a redelivered payment.
//
// The services themselves (the invoices, ledger, inventory and stats
// consumers, the charge outbox and its relay, the schema with its unique
// index) are in internal/demo/billing, where `idem demo` runs them next to
// their naive versions; read them there. This package's examples run them
// as a service would, with an inbox of their own, on SQLite so that they
// need no server: the same code runs on PostgreSQL through the pgx
// database/sql driver and sqlinbox.Postgres.
//
//	go test -v -run Example ./examples/billing
package billing
