// Package billing holds the reference services of the billing incident that
// idem exists to prevent: a RabbitMQ restart redelivered 3,100 unacknowledged
// SubscriptionRenewed messages and 1,247 customers were invoiced twice.
//
// Each service is a consumer written once over *sql.Tx, so it runs on SQLite
// and on PostgreSQL (through the pgx stdlib driver) with the same SQL: the
// statements use $1-style parameters, which SQLite also binds by number.
//
//   - invoices ([InvoicesConfig]): SubscriptionRenewed → one invoice per
//     customer and period. The business key is the inbox key, a partial
//     unique index guards the table, the invoice records the message that
//     created it, and the charge is queued in the same transaction
//     ([ChargeRelay] sends it after commit with the idempotency key
//     renew-<subscription>-<period>).
//   - ledger ([LedgerConfig]): OrderPaid → merchant balance += amount, keyed
//     by event ID.
//   - inventory ([InventoryConfig]): OrderPlaced → stock −= quantity, keyed
//     by order and product.
//   - stats ([StatsConfig]): the month's revenue recomputed from the
//     invoices, naturally idempotent, no inbox.
//
// [Gateway] is an in-process payment gateway that honours idempotency keys
// and counts real charges. The naive variants ([NaiveInvoicesConfig],
// [NaiveLedgerConfig], [NaiveInventoryConfig]) are the code of the incident:
// no inbox, no constraint, a charge without a key. They exist only so that
// `idem demo` (cmd/idem/internal/demo) can show the damage next to its
// absence.
//
// The package imports nothing of idem's internals: copy it as the start of a
// service of your own. Its examples run the services as a service would, with
// an inbox of their own, on SQLite so that they need no server; the same code
// runs on PostgreSQL through the pgx database/sql driver and
// sqlinbox.Postgres, and on MySQL/MariaDB through [For]:
//
//	go test -v -run Example ./examples/billing
package billing
