// Package audit repairs a business table after duplicates already happened,
// the half of an at-least-once incident that an inbox cannot undo: a broker
// restart redelivered unacknowledged messages, a consumer that was not
// idempotent ran them again, and customers were invoiced twice.
//
// The repair follows the order that keeps evidence and money safe:
//
//  1. [Auditor.Duplicates] confirms the duplicates are real: every key held by
//     more than one live row, with count, earliest and latest creation time,
//     total amount and whether a row is paid; exact totals; and a verdict on
//     whether duplicates are still being created (see [Activity]). If they
//     are, fix the producer first: cleaning up now is work that comes back.
//
//  2. Paid duplicates need a refund and a human decision; they are listed,
//     never voided by default.
//
//  3. [Auditor.Void] marks every live row but the earliest of each key as
//     voided (status, reason, actor, time), in one transaction, dry run by
//     default. It never deletes: the rows are the evidence for
//     reconciliation with the payment gateway and for the audit.
//
//  4. [Auditor.Guard] builds the partial unique index that fences the table
//     for good, on the key over rows that are not voided, after checking
//     no violation remains:
//
//     CREATE UNIQUE INDEX CONCURRENTLY ux_invoices_customer_id_period
//     ON invoices (customer_id, period) WHERE status <> 'VoidedDuplicate';
//
//  5. [Auditor.Check] (and [Auditor.Watch]) counts duplicate groups among live
//     rows: zero once the index exists; anything else means the index was
//     dropped or a write path bypassed it.
//
// A row is live when its status is not the void value (NULL counts as live)
// and no key column is NULL (a unique index ignores such rows too).
//
// A table without a status column ([Spec.Status] set to [NoColumn]) has
// every row live; its guard is a plain unique index on the key, and there is
// nothing to void with, so the extra rows are removed or merged by hand
// before the guard. A table without an id column ([Spec.ID] set to
// [NoColumn]) is reported by row address (ctid); [Auditor.Void] needs both
// columns and refuses without them.
//
// Names of tables, columns and indexes are validated (letters, digits, _ and
// $, optionally schema.table) and always quoted; values are bind parameters.
// The package runs on PostgreSQL through pgx ([New]) and on MySQL 8 or
// MariaDB 10.6 through database/sql and github.com/go-sql-driver/mysql
// ([NewMySQL], which lists what differs there: no partial index, so the
// guard is a unique index on the key plus a generated column that is NULL
// for voided rows). The command line is `idem audit duplicates|void|guard|check`.
package audit
