package idem

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Store is the seam between a [Processor] and a database: an inbox table and
// the transactions around it. TTx is the store's own transaction type
// (pgx.Tx, *sql.Tx), handed unchanged to handlers.
//
// The interface is for store authors and may change between minor versions;
// every store must pass the shared conformance suite in package inboxtest.
type Store[TTx any] interface {
	// Begin starts a transaction.
	Begin(ctx context.Context) (TTx, error)
	// Commit commits tx. When the outcome is unknown (the connection failed
	// before the server answered) the error must wrap [ErrCommitUnknown].
	Commit(ctx context.Context, tx TTx) error
	// Rollback rolls tx back; it must be safe to call after a failed
	// statement.
	Rollback(ctx context.Context, tx TTx) error
	// Claim inserts one marker per claim in ONE statement, in the order given
	// (the processor sorts claims by key so that two batches with overlapping
	// keys cannot deadlock), skipping keys already present (ON CONFLICT DO
	// NOTHING). It reports, per claim, whether this transaction inserted it.
	// A concurrent claim of the same key blocks on the unique index until the
	// other transaction ends; lockTimeout bounds that wait where the database
	// supports it (0 means the database default).
	Claim(ctx context.Context, tx TTx, consumer string, claims []Claim, lockTimeout time.Duration) (inserted []bool, err error)
	// Lookup returns the markers that exist for keys, for logging duplicates
	// and for extending their life ([Extender]).
	Lookup(ctx context.Context, tx TTx, consumer string, keys []string) (map[string]Marker, error)
	// Classify tells a transient error from a permanent one, by error type
	// and SQLSTATE, never by message text. Errors that are not the
	// database's (a handler's own) are transient.
	Classify(err error) ErrorClass
}

// Claim is one marker to insert.
type Claim struct {
	Key        string
	MessageID  string
	BodySHA256 []byte
	// EventTime is the message's event time (zero when unknown). A marker
	// is kept at least a window past the later of it and the claim.
	EventTime time.Time
	// PartitionTime places the marker in a partitioned inbox (zero on the
	// plain layout). It is a function of Key alone ([PartitionTimeFunc]), so
	// every copy of a message, whatever its timestamps, meets its marker.
	PartitionTime time.Time
}

// Layout is how an inbox table is laid out.
type Layout int

const (
	// LayoutPlain is one table with a unique (consumer, key); old markers
	// are pruned by batched DELETE.
	LayoutPlain Layout = iota
	// LayoutPartitioned is a table partitioned by day of the partition time,
	// a function of the key; old days are dropped whole.
	LayoutPartitioned
)

// String names the layout as the CLI spells it.
func (l Layout) String() string {
	switch l {
	case LayoutPlain:
		return "plain"
	case LayoutPartitioned:
		return "partitioned"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// Settings is what an inbox's migration records beside its table
// (docs/design.md 10): every processor, prune and CLI reads it, so none can
// guard with a longer horizon or prune with a shorter window than the
// table keeps.
type Settings struct {
	Layout Layout
	// Window is the longest horizon a consumer may guard with now: how long
	// markers are kept, except while a lengthened window ramps up.
	Window time.Duration
	// Stored is the window stored with the table (the one Window ramps up
	// to); 0 means Window.
	Stored time.Duration
}

// SettingsStore is a store whose retention settings live in the database.
// A [Processor] over one reads them before its first message (and again
// from time to time) and refuses to guard with a horizon longer than the
// stored window.
type SettingsStore interface {
	Settings(ctx context.Context) (Settings, error)
}

// TxSettingsStore is a store that reads its settings, and its pruned-key
// summaries ([PrunedSummaryStore]), in a transaction the caller holds.
// [Processor.ProcessTx] reads them there: the caller's transaction may hold
// the pool's only connection (one connection per operation). A processor
// refusing late duplicates (Config.RefuseLate) also reads the summaries in
// a claim's own transaction when a message it just claimed needs the late
// check, so a prune that just committed is never missed.
type TxSettingsStore[TTx any] interface {
	SettingsIn(ctx context.Context, tx TTx) (Settings, error)
	PrunedSummariesIn(ctx context.Context, tx TTx, consumer string) ([]PrunedSummary, error)
}

// LayoutStore is a store that knows its layout without asking the
// database, so [NewProcessor] can refuse, at construction, a consumer of a
// partitioned inbox that cannot derive a partition time from its key.
type LayoutStore interface {
	Layout() Layout
}

// Extension raises a marker's keep-until time: a later message for the
// same key proved the marker still needed until then.
type Extension struct {
	Key       string
	KeepUntil time.Time
}

// Extender is a store that can extend markers' lives (docs/design.md 8). In tx,
// it sets each key's keep-until to the given time where that is later than
// the stored one, and writes nothing otherwise.
type Extender[TTx any] interface {
	Extend(ctx context.Context, tx TTx, consumer string, ext []Extension) error
}

// HorizonRecorder is a store that records, beside its settings, the horizon
// each consumer guards with, so that shortening the stored window below a
// horizon in use can be refused. [Processor.Check] records the consumer's.
type HorizonRecorder interface {
	RecordHorizon(ctx context.Context, consumer string, horizon time.Duration) error
}

// CommitNeeder is a store whose claim can leave in a transaction work that
// only the transaction's COMMIT completes, so that the processor commits
// it even when every message in it was a duplicate (it otherwise rolls
// such a transaction back, having nothing to write). pgxinbox needs it on
// a server with synchronous standbys: a marker found may be on the primary
// alone, and the Duplicate answers must wait for a COMMIT that waits for
// the standbys. The answers of a batch whose COMMIT fails are not sent. A
// store that wraps another (for metrics, say) must forward it, or the
// protection is lost.
type CommitNeeder[TTx any] interface {
	NeedsCommit(tx TTx) bool
}

// Pinger is a store that can tell whether its database answers now, on a
// connection other than a transaction's. After a handler failed on a
// deadline of its own (a query bounded by its own context, which drivers
// answer by closing the connection), the processor pings: a database that
// answers means the query was slow, the message's failure, which spends
// its attempts; one that does not is an outage, which spends none.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Breaker is a store that can tell whether a transaction's connection is
// gone. After a handler's failure the processor asks: when the inbox's own
// connection died under it (the server shut down, the backend was
// terminated), the failure is an outage, not the message's, and spends
// none of its attempts; the same "connection refused" from the handler's
// payment gateway, on a live transaction, does.
type Breaker[TTx any] interface {
	Broken(tx TTx) bool
}

// SchemaProblem is one thing wrong with an inbox table, found by a
// [SchemaChecker]: what is wrong, in plain words, and how to fix it (a
// command to run, or the statement that repairs it).
type SchemaProblem struct {
	What string
	Fix  string
	// Advisory marks a problem a consumer starts with, logged by
	// [Processor.Check]: a schema newer than its build, which a rolling
	// deploy makes while older consumers still run (migrations keep their
	// claims working where they can; a claim that fails is held and
	// retried, never lost). The others stop it.
	Advisory bool
}

// String is the problem and its fix on one line.
func (p SchemaProblem) String() string { return p.What + " (fix: " + p.Fix + ")" }

// SchemaChecker is a store that can verify its inbox table: that it exists
// with the columns, unique key and indexes its claims and prunes need, in
// the layout the store is configured for, with its stored settings, at the
// schema version of this build, and (partitioned) with partitions for today
// and tomorrow. [Processor.Check] calls it first and refuses to start on
// any problem that is not [SchemaProblem.Advisory]. Check returns an error
// only when it could not look (the database is unreachable); a table that
// is not as it should be is a problem, not an error.
type SchemaChecker interface {
	Check(ctx context.Context) ([]SchemaProblem, error)
}

// SchemaError is the problems a [SchemaChecker] found with an inbox
// table, each naming the table. It is a configuration error:
// errors.Is(err, ErrConfig) holds.
type SchemaError struct {
	Problems []SchemaProblem
}

// Error lists every problem with its fix.
func (e *SchemaError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap makes a SchemaError an [ErrConfig]: waiting does not fix it.
func (e *SchemaError) Unwrap() error { return ErrConfig }

// MigrateReport is what a store's migration did to its inbox table.
type MigrateReport struct {
	// Table is the table's name as configured.
	Table string
	// Layout and Window are the table's stored layout and window.
	Layout Layout
	Window time.Duration
	// Created is true when the table did not exist before.
	Created bool
	// From and To are the schema versions before and after: equal when the
	// table was up to date.
	From, To int
	// Partitions is how many daily partitions were created (partitioned
	// layout).
	Partitions int
}

// String says what happened in a sentence: "created idem_inbox (plain
// layout, window 14d, schema version 2)", "idem_inbox is up to date (schema
// version 2)" or "upgraded idem_inbox from version 1 to 2".
func (r MigrateReport) String() string {
	var s string
	switch {
	case r.Created:
		s = fmt.Sprintf("created %s (%s layout, window %s, schema version %d)", r.Table, r.Layout, formatWindow(r.Window), r.To)
	case r.From == r.To:
		s = fmt.Sprintf("%s is up to date (schema version %d)", r.Table, r.To)
	default:
		s = fmt.Sprintf("upgraded %s from version %d to %d", r.Table, r.From, r.To)
	}
	switch {
	case r.Partitions == 1:
		s += "; created 1 daily partition"
	case r.Partitions > 1:
		s += fmt.Sprintf("; created %d daily partitions", r.Partitions)
	}
	return s
}

// formatWindow writes a window in whole days when it is whole days (14d),
// as Go writes durations otherwise.
func formatWindow(w time.Duration) string {
	const day = 24 * time.Hour
	if w > 0 && w%day == 0 {
		return fmt.Sprintf("%dd", w/day)
	}
	return w.String()
}
