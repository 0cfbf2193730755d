// Package idemstore is the contract between an idem [Processor] and the
// database that holds its inbox: the one interface, [Store], that every
// inbox store implements, and the types that cross it. It is to package
// idem what database/sql/driver is to database/sql.
//
// Application authors use a store (pgxinbox, sqlinbox, mysqlinbox,
// sqliteinbox) and package idem, and meet this package only for the
// values a store hands back to them: a [Marker] in a duplicate's result,
// a [MigrateReport], a [Durability] report, an [ErrorClass] in an attempt
// hook. Store authors implement [Store] in full and run the conformance
// suite in package storetest against a real database.
//
// The seam has one interface on purpose. Every capability a store has is
// a method of [Store], so a store that wraps another (for metrics, for
// tracing) forwards all of them or does not compile: a wrapper can no
// longer drop, unseen, the protection an optional method gave (a commit
// the synchronous standbys must see, a schema check at start).
//
// [Store] is for store authors and may change between minor versions;
// outside implementations must expect to add methods.
//
// [Processor]: https://pkg.go.dev/github.com/idemkit/idem#Processor
package idemstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Store is the seam between an idem Processor and a database: an inbox
// table, the transactions around it, and what the table's migration
// recorded beside it. TTx is the store's own transaction type (pgx.Tx,
// *sql.Tx), handed unchanged to handlers.
//
// Every store implements every method: a store that wraps another forwards
// each one (embedding the wrapped Store does). The interface is unstable
// for implementations outside this module: methods may be added between
// minor versions. Every store must pass the conformance suite in package
// storetest.
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
	// and for extending their life (Extend).
	Lookup(ctx context.Context, tx TTx, consumer string, keys []string) (map[string]Marker, error)
	// Extend extends markers' lives (docs/design.md 8): in tx, it sets each
	// key's keep-until to the given time where that is later than the
	// stored one, and writes nothing otherwise.
	Extend(ctx context.Context, tx TTx, consumer string, ext []Extension) error
	// Classify tells a transient error from a permanent one, by error type
	// and SQLSTATE, never by message text. Errors that are not the
	// database's (a handler's own) are transient.
	Classify(err error) ErrorClass

	// Layout is the layout the store is configured for, known without
	// asking the database, so that a processor can refuse, at
	// construction, a consumer of a partitioned inbox that cannot derive
	// a partition time from its key.
	Layout() Layout
	// Window is the retention window the store is configured with, known
	// without asking the database: a processor whose consumer set no
	// horizon guards with it until it has read the stored settings. 0
	// means the store has none.
	Window() time.Duration
	// Settings reads the settings the inbox's migration recorded beside its
	// table (docs/design.md 10). A processor reads them before its first
	// message and again from time to time, and refuses to guard with a
	// horizon longer than the stored window. A store that records none (a
	// store for tests) returns the zero Settings.
	Settings(ctx context.Context) (Settings, error)
	// SettingsIn is Settings read in tx, a transaction the caller holds:
	// the caller of ProcessTx may hold the pool's only connection.
	SettingsIn(ctx context.Context, tx TTx) (Settings, error)
	// RecordHorizon records, beside the settings, the horizon consumer
	// guards with, so that shortening the stored window below a horizon in
	// use can be refused.
	RecordHorizon(ctx context.Context, consumer string, horizon time.Duration) error
	// PrunedSummaries returns the summaries of the keys prunes deleted for
	// consumer (see package retention), newest first. A processor checks
	// every fresh key against them in memory: a hit is a message whose
	// marker is gone (a replay older than the window, or an untimed
	// message redelivered after its marker was pruned), which no inbox can
	// otherwise tell from a new one. A store whose prunes keep none
	// returns none.
	PrunedSummaries(ctx context.Context, consumer string) ([]PrunedSummary, error)
	// PrunedSummariesIn is PrunedSummaries read in tx. A processor refusing
	// late duplicates reads them in a claim's own transaction when a
	// message it just claimed needs the late check, so that a prune that
	// just committed is never missed.
	PrunedSummariesIn(ctx context.Context, tx TTx, consumer string) ([]PrunedSummary, error)

	// NeedsCommit reports whether the claim left in tx work that only the
	// transaction's COMMIT completes, so that the processor commits tx
	// even when every message in it was a duplicate (it otherwise rolls
	// such a transaction back). pgxinbox needs it on a server with
	// synchronous standbys: a marker found may be on the primary alone,
	// and the Duplicate answers must wait for a COMMIT that waits for the
	// standbys. The answers of a batch whose COMMIT fails are not sent.
	NeedsCommit(tx TTx) bool
	// Ping tells whether the database answers now, on a connection other
	// than a transaction's. After a handler failed on a deadline of its
	// own (a query bounded by its own context, which drivers answer by
	// closing the connection), the processor pings: a database that
	// answers means the query was slow, the message's failure, which
	// spends its attempts; one that does not is an outage, which spends
	// none. A store with no database to lose returns nil.
	Ping(ctx context.Context) error
	// Broken reports whether tx's connection is gone. After a handler's
	// failure the processor asks: when the inbox's own connection died
	// under it (the server shut down, the backend was terminated), the
	// failure is an outage, not the message's, and spends none of its
	// attempts; the same "connection refused" from the handler's payment
	// gateway, on a live transaction, does.
	Broken(tx TTx) bool
	// Check verifies the inbox table: that it exists with the columns,
	// unique key and indexes its claims and prunes need, in the layout the
	// store is configured for, with its stored settings, at the schema
	// version of this build, and (partitioned) with partitions for today
	// and tomorrow. A processor's Check calls it first and refuses to start
	// on any problem that is not [SchemaProblem.Advisory]. Check returns an
	// error only when it could not look (the database is unreachable); a
	// table that is not as it should be is a problem, not an error.
	Check(ctx context.Context) ([]SchemaProblem, error)
	// Durability reads the database's commit and replication settings. A
	// processor's Check asks at start and logs every risk as a warning; a
	// consumer still starts (running on asynchronous replication can be a
	// deliberate choice), and a store that cannot read the settings is
	// logged, not refused.
	Durability(ctx context.Context) (Durability, error)
	// Paused reads consumer's pause, an operator's `idem consumer pause`
	// kept beside the inbox; the zero Pause when it is not paused. A
	// processor reads it every few seconds and, while it is paused, claims
	// nothing and holds every message it is given. It never fails on an
	// inbox migrated before pauses existed: such an inbox has no paused
	// consumer. A store that keeps no pauses returns the zero Pause.
	Paused(ctx context.Context, consumer string) (Pause, error)
	// PausedIn is Paused read in tx, a transaction the caller holds.
	PausedIn(ctx context.Context, tx TTx, consumer string) (Pause, error)

	// RecordPositions records, in tx, how far consumer has settled each
	// source of ps (docs/design.md 17): an upsert of one small row per
	// source, committed or rolled back with the claims and effects of the
	// same transaction, so that the database never vouches for a position
	// whose records it does not hold. The processor calls it before COMMIT
	// for a batch whose messages carry positions (idem.Message.Next).
	RecordPositions(ctx context.Context, tx TTx, consumer string, ps []Position) error
	// Positions returns the positions recorded for consumer, one per
	// source, in source order. None when nothing is recorded (positions
	// never recorded, or forgotten).
	Positions(ctx context.Context, consumer string) ([]Position, error)
	// ForgetPositions deletes the positions recorded for consumer and
	// returns how many it deleted: after a database deliberately reset,
	// the broker's committed positions are then trusted as they are.
	ForgetPositions(ctx context.Context, consumer string) (int64, error)
}

// Position is how far a consumer has settled one source (a Kafka
// partition, as "topic/partition"): every record before Next was
// applied, was a duplicate or was dead-lettered, and the database that
// holds the position holds the effects and markers of those applied.
type Position struct {
	Source string
	// Next is the source's position just past the last settled record
	// (a Kafka offset plus one).
	Next int64
	// Updated is when the position was last recorded (zero when the store
	// does not say).
	Updated time.Time
}

// ErrCommitUnknown is wrapped by a store's Commit error when the
// connection failed during COMMIT, so that the effect may or may not be
// durable. Package idem exports the same error as idem.ErrCommitUnknown.
var ErrCommitUnknown = errors.New("commit outcome unknown")

// ErrorClass is how a store classifies a database error.
type ErrorClass int

const (
	// ClassTransient errors may succeed when tried again: serialization
	// failure (40001), deadlock (40P01), lock timeout (55P03), a lost
	// connection, or any handler error not marked permanent.
	ClassTransient ErrorClass = iota
	// ClassPermanent errors fail the same way every time: a constraint the
	// handler broke (class 23) or bad data (22). The message is dead-lettered
	// at once. A missing table (42) is NOT permanent: during a deploy it may
	// appear a moment later, so it is retried and left to the broker.
	ClassPermanent
	// ClassUnavailable errors say the database itself cannot be reached: a
	// refused or lost connection, an admin shutdown, too many connections.
	// They are transient, and they are not the message's fault, so retrying
	// them does not spend the message's attempts (RetryPolicy.WaitUnavailable).
	ClassUnavailable
	// ClassBusy errors say the transaction met another one: a
	// serialization failure (40001), a deadlock (40P01), a lock timeout
	// (55P03). Met by the claim (another transaction holds the key), they
	// are waited out like an outage (ErrBusy), never spent from the
	// message's attempts nor dead-lettered. Met by the handler's own
	// statements, they are waited out for RetryPolicy.MaxContention tries
	// in a row and then spend attempts (ErrContention).
	ClassBusy
	// ClassConfig errors say the inbox (or the handler's own schema) is not
	// set up for this consumer: an undefined table (42P01), a missing
	// permission (42501), an unknown database (3D000), failed
	// authentication (class 28). A deploy that runs before its migration
	// gives them on every message. They are outages, not the message's
	// fault: held and retried, never dead-lettered, and reported with the
	// fix.
	ClassConfig
)

// Claim is one marker to insert.
type Claim struct {
	Key        string
	MessageID  string
	BodySHA256 []byte
	// EventTime is the message's event time (zero when unknown). A marker
	// is kept at least a window past the later of it and the claim.
	EventTime time.Time
	// PartitionTime places the marker in a partitioned inbox (zero on the
	// plain layout). It is a function of Key alone (Config.PartitionTime),
	// so every copy of a message, whatever its timestamps, meets its
	// marker.
	PartitionTime time.Time
}

// Marker is a row of the inbox: the claim of one key by one consumer.
type Marker struct {
	Key         string
	MessageID   string
	BodySHA256  []byte
	ProcessedAt time.Time
	// KeepUntil is the time the marker's retention is counted from: the
	// latest of its write time and the event times of the messages that
	// met it. Zero when the store does not record it.
	KeepUntil time.Time
}

// Extension raises a marker's keep-until time: a later message for the
// same key proved the marker still needed until then.
type Extension struct {
	Key       string
	KeepUntil time.Time
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
	// markers are kept, except while a lengthened window ramps up. 0 means
	// the store records no settings.
	Window time.Duration
	// Stored is the window stored with the table (the one Window ramps up
	// to); 0 means Window.
	Stored time.Duration
}

// Pause is an operator's pause of one consumer: while Paused, every
// instance of the consumer holds its messages unapplied, without spending
// their attempts, until it is resumed.
type Pause struct {
	Paused bool
	// Since is when it was paused (the database's clock); By who paused
	// it and Why why, as the operator gave them.
	Since time.Time
	By    string
	Why   string
}

// PrunedSummary is a compact record of the keys whose markers a prune
// deleted for one consumer: a Bloom filter, which may answer yes for a key
// it never saw (at its false-positive rate) but never no for one it did.
type PrunedSummary struct {
	// Day is the UTC day of the prune.
	Day time.Time
	// Has reports whether key was probably among the pruned markers.
	Has func(key string) bool
}

// SchemaProblem is one thing wrong with an inbox table, found by
// [Store.Check]: what is wrong, in plain words, and how to fix it (a
// command to run, or the statement that repairs it).
type SchemaProblem struct {
	What string
	Fix  string
	// Advisory marks a problem a consumer starts with, logged by the
	// processor's Check: a schema newer than its build, which a rolling
	// deploy makes while older consumers still run (migrations keep their
	// claims working where they can; a claim that fails is held and
	// retried, never lost). The others stop it.
	Advisory bool
}

// String is the problem and its fix on one line.
func (p SchemaProblem) String() string { return p.What + " (fix: " + p.Fix + ")" }

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

// Durability is what a store's database says about whether a commit it
// acknowledges survives the loss of the server: the settings read, and
// each way an acknowledged effect could still be lost.
//
// The hazard it names is the one the inbox cannot guard against by
// itself: idem acks the broker only after the database acknowledged the
// COMMIT of effect and marker, so a commit the database acknowledges and
// then forgets (an asynchronous standby promoted before it received the
// commit, a crash with synchronous_commit off) leaves the message acked
// and its effect gone.
type Durability struct {
	// Settings are the settings read, by name (synchronous_commit,
	// synchronous_standby_names, the number of streaming standbys, ...).
	Settings map[string]string
	// Risks are the ways an acknowledged effect could be lost, each with
	// its fix. None means the settings keep every acknowledged commit
	// across the failures they cover.
	Risks []DurabilityRisk
}

// DurabilityRisk is one way an acknowledged effect could be lost.
type DurabilityRisk struct {
	What string
	Fix  string
}

// String is the risk and its fix on one line.
func (r DurabilityRisk) String() string { return r.What + " (fix: " + r.Fix + ")" }

// Summary is the settings read, in a stable order, on one line.
func (d Durability) Summary() string {
	keys := make([]string, 0, len(d.Settings))
	for k := range d.Settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + "=" + d.Settings[k])
	}
	return b.String()
}
