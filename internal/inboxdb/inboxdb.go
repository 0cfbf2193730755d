// Package inboxdb is what the inbox stores (pgxinbox, sqlinbox) share: the
// migrator, the prune, the stats and the stored retention settings, written
// once over a small seam each store implements ([Driver]: a migration
// transaction, a plain transaction, the prune leader's session), and the SQL
// of every dialect as named statements, one file per dialect
// (postgres.go, sqlite.go), so that the PostgreSQL claim, prune or
// settings statement is read in one place.
//
// The stores keep only what their transaction types need: running the claim,
// lookup and extend statements inside a handler's pgx.Tx or *sql.Tx, and
// (pgxinbox) the partition DDL.
package inboxdb

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/migrator"
)

// CleanupTimeout bounds the statements that end an operation after its
// caller's context may have ended (a rollback, giving the prune election
// up): they must still run, but never wait forever on a database that
// stopped answering.
const CleanupTimeout = 10 * time.Second

// Cleanup is ctx without its cancellation, bounded by [CleanupTimeout].
func Cleanup(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
}

// rollback rolls tx back under [Cleanup].
func rollback(ctx context.Context, tx Tx) {
	ctx, cancel := Cleanup(ctx)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// Row is one result row: pgx.Row and *sql.Row both are. It is the
// migrator's, so that a [Conn] is a migrator.Conn and the other way round.
type Row = migrator.Row

// Conn runs statements: a transaction, or one session.
type Conn interface {
	// Exec runs a statement and returns the rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// QueryRow runs a statement that returns one row.
	QueryRow(ctx context.Context, sql string, args ...any) Row
	// Query runs a statement and calls each with every row it returns.
	Query(ctx context.Context, sql string, each func(Row) error, args ...any) error
}

// Tx is a transaction.
type Tx interface {
	Conn
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Driver is the seam between the shared logic and one store: the few
// operations whose shape depends on the client library. Statements come
// from the store's [Dialect].
type Driver interface {
	// BeginMigration opens the transaction migrations and settings changes
	// run in, serialized against every other migrator of the database (an
	// advisory lock on PostgreSQL, BEGIN IMMEDIATE on SQLite).
	BeginMigration(ctx context.Context) (Tx, error)
	// Begin opens a plain transaction, for small writes.
	Begin(ctx context.Context) (Tx, error)
	// Read runs f on a connection for reads that take no write lock: on
	// SQLite a transaction would (every one begins IMMEDIATE there), and
	// wait behind a caller's open transaction.
	Read(ctx context.Context, f func(Conn) error) error
	// Lead elects one pruning instance per table: it returns the leader's
	// session, on which each prune batch is a transaction of its own
	// ([Session.BeginBatch]), and release, which gives the election up.
	// ok is false, with nothing to release, when another instance leads.
	Lead(ctx context.Context, d *Dialect) (s Session, release func(), ok bool, err error)
}

// Session is the prune leader's session.
type Session interface {
	// Conn runs statements in autocommit on the session.
	Conn
	// BeginBatch begins the transaction of one prune batch on the session
	// itself, never on another connection of the pool: the batch's
	// DELETE (the dialect's PruneBatch, run with Query, returns the
	// consumer and key of every marker it deleted) and the growth of the
	// pruned-key summaries commit together.
	BeginBatch(ctx context.Context) (Tx, error)
}

// Table is a validated, possibly schema-qualified inbox table name.
type Table struct {
	Schema string // empty: the connection's default (search_path, main)
	Name   string
}

// quoteIdent quotes one identifier. Table names are validated before they
// get here (no quotes in them); doubling quotes keeps this safe on its own.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Sibling is the quoted name of a table next to t (same schema).
func (t Table) Sibling(name string) string {
	if t.Schema == "" {
		return quoteIdent(name)
	}
	return quoteIdent(t.Schema) + "." + quoteIdent(name)
}

// Quoted is t's own quoted name; it also keys t in the bookkeeping tables,
// as it always has (both stores wrote it so).
func (t Table) Quoted() string { return t.Sibling(t.Name) }

// String is the name as the user wrote it: the label of metrics and the
// name in errors, the same for every store.
func (t Table) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// maxIdent is PostgreSQL's identifier limit in bytes; longer names are cut
// silently, so every derived name must fit.
const maxIdent = 63

// IndexName is the unqualified name of t's index on a column: the table's
// name, the column and "_idx". When that exceeds 63 bytes, the table part is
// cut and a hash of the whole table name keeps the result distinct: cut by
// PostgreSQL instead, a 63-byte table name would name its index after the
// table itself, which CREATE INDEX IF NOT EXISTS then skips without an error,
// and two long names sharing a prefix would share one index name.
func (t Table) IndexName(column string) string {
	tail := "_" + column + "_idx"
	if len(t.Name)+len(tail) <= maxIdent {
		return t.Name + tail
	}
	h := fnv.New32a()
	h.Write([]byte(t.Name))
	tag := fmt.Sprintf("_%08x", h.Sum32())
	return t.Name[:maxIdent-len(tail)-len(tag)] + tag + tail
}

// Dialect is one database's SQL for one inbox table, as named statements.
// Statements that bind a list (the claim on SQLite) come in pieces the
// store glues; the rest are whole. Parameters are numbered as documented on
// each field; where a field says "head", the store appends one group per
// element.
type Dialect struct {
	Name string
	// Table is the inbox; Layout its layout.
	Table  Table
	Layout idemstore.Layout

	// TimeArg binds a time; ScanTime reads one scanned into an any (nil for
	// NULL).
	TimeArg  func(time.Time) any
	ScanTime func(any) (time.Time, error)

	// migrations is the directory of the layout's migration templates.
	migrations string

	// The hot path, run by the stores in the handler's transaction.
	Claim List
	// ClaimOne claims one key, the claim of a message processed on its
	// own, without the arrays of Claim (PostgreSQL; "" elsewhere): $1
	// consumer, $2 key, $3 message ID, $4 body hash, $5 event time (NULL
	// when unknown), and on the partitioned layout $6 partition time. Its
	// command tag says whether the row was inserted.
	ClaimOne string
	// ClaimLocked and ClaimOneLocked are Claim.SQL and ClaimOne that also
	// set the transaction's lock_timeout, before they insert, from one
	// more parameter after the others (PostgreSQL; "" elsewhere).
	ClaimLocked    string
	ClaimOneLocked string
	Lookup         List
	Extend         List

	// Retention.
	Now        string // the database's clock
	PruneBatch string // $1 cutoff, $2 limit: deletes one batch, returning consumer and key
	Prunable   string // $1 cutoff: counts what a prune deletes
	// Stats: $1 cutoff → rows, markers without event time, oldest
	// retention time, prunable.
	Stats   string
	TryLock string // $1 table: the prune election (PostgreSQL)
	Unlock  string // $1 table

	// Bookkeeping, beside the inbox table.
	Bookkeeping    []string // creates the shared tables, idempotently
	ReadVersion    string   // $1 table → version
	WriteVersion   string   // $1 table, $2 version
	Relkind        string   // $1 table → relkind (PostgreSQL; "" elsewhere)
	ReadSettings   string   // $1 table → layout, window_ms, previous_window_ms, ms since changed_at
	InsertSettings string   // $1 table, $2 layout, $3 window_ms
	UpdateWindow   string   // $1 table, $2 window_ms, $3 previous_window_ms (NULL: no ramp)
	RecordHorizon  string   // $1 table, $2 consumer, $3 horizon_ms
	Horizons       string   // $1 table → consumer, horizon_ms, seen_at; longest first

	// Operators' pauses of consumers.
	PausesExist string // → 0: no pauses table, 1: it exists, 2: it exists and the role may not read it (catalog only: never fails)
	ReadPause   string // $1 table, $2 consumer → paused_at, paused_by, reason
	ListPauses  string // $1 table → consumer, paused_at, paused_by, reason; by consumer
	InsertPause string // $1 table, $2 consumer, $3 by, $4 why: affects no row when already paused
	DeletePause string // $1 table, $2 consumer
	LogPause    string // $1 table, $2 consumer, $3 action (pause, resume), $4 by, $5 why
	// Positions of log-broker sources (docs/design.md 17).
	RecordPosition  string // $1 table, $2 consumer, $3 source, $4 next
	Positions       string // $1 table, $2 consumer → source, next, updated_at; by source
	ForgetPositions string // $1 table, $2 consumer

	// Pruned-key summaries (Bloom filters of the keys a prune deleted).
	InsertSummary string // $1 table, $2 consumer, $3 pruned_at, $4 source, $5 keys, $6 filter
	SummaryTimes  string // $1 table, $2 consumer → pruned_at, source, keys; newest first
	OpenSummary   string // $1 table, $2 consumer, $3 start of today → pruned_at, keys, filter of today's newest DELETE summary
	GrowSummary   string // $1 table, $2 consumer, $3 pruned_at, $4 keys, $5 filter
	RecentKeys    string // $1 table, $2 consumer, $3 since → keys summarised since
	SummaryLock   string // $1 table: serializes summary writers for the transaction ("" where BEGIN IMMEDIATE does)
	ReadSummary   string // $1 table, $2 consumer, $3 pruned_at, $4 source → filter
	DeleteSummary string // $1 table, $2 older than: summaries past their keep
	PartitionKeys string // format with a partition's quoted name → consumer, key (partitioned)
}

// List is a statement over a list of items. On PostgreSQL it is one
// statement (SQL) binding arrays; on SQLite, which has none, a Head, one Row
// group of RowParams parameters per item, joined by commas, and a Tail.
type List struct {
	SQL       string
	Head      string
	Row       string
	RowParams int
	Tail      string
}

// Build glues the statement for n items.
func (l List) Build(n int) string {
	if l.SQL != "" {
		return l.SQL
	}
	var b strings.Builder
	b.Grow(len(l.Head) + len(l.Tail) + n*(len(l.Row)+1))
	b.WriteString(l.Head)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.Row)
	}
	b.WriteString(l.Tail)
	return b.String()
}
