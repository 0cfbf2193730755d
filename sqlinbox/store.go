package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/retention"
)

// DefaultTable is the inbox table's name when [Config.Table] is empty.
const DefaultTable = "idem_inbox"

// Config configures a [Store]. A nil *Config means all defaults.
type Config struct {
	// Table names the inbox table. Defaults to "idem_inbox". On PostgreSQL
	// it may be schema-qualified ("billing.idem_inbox"); otherwise it is
	// resolved by search_path. Each part must match
	// ^[A-Za-z_][A-Za-z0-9_]{0,62}$; it is quoted, so case is kept.
	Table string
	// Window is how long markers are kept, counted from their keep_until
	// (the latest of their write time and the event times of the messages
	// that met them). It is stored with the table by [Store.Migrate] when
	// the table is created (14 days when 0) and read from there by every
	// processor, prune and CLI; a different non-zero Window on an existing
	// table makes Migrate fail (change the stored one with
	// [Store.SetWindow] or `idem inbox window set`).
	Window time.Duration
	// Hooks receive retention metrics (markers pruned, oldest marker age:
	// the retention package's hook interfaces), labelled with Table as
	// written, as pgxinbox labels them. Optional.
	Hooks []idem.Hook
	// Logger logs changes of the stored window. Defaults to slog.Default().
	Logger *slog.Logger
}

// Store is an inbox on database/sql. It implements [idemstore.Store] with
// *sql.Tx as the transaction type, so handlers run database/sql (or sqlc)
// code in the claim's transaction. It is safe for concurrent use.
type Store struct {
	db      *sql.DB
	dialect Dialect
	table   tableName
	sql     *inboxdb.Dialect
	inbox   *inboxdb.Inbox
	// window is the configured window until Migrate or Settings read the
	// stored one (nanoseconds).
	window atomic.Int64
}

var _ idemstore.Store[*sql.Tx] = (*Store)(nil)

// New returns a store over db, which must be opened with the driver that
// matches dialect. It checks the table name (an invalid one is an error
// wrapping [idem.ErrConfig]) but does not touch the database; call
// [Store.Migrate] to create the table.
func New(db *sql.DB, dialect Dialect, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlinbox: db is nil", idem.ErrConfig)
	}
	if dialect == nil {
		return nil, fmt.Errorf("%w: sqlinbox: dialect is nil (use sqlinbox.Postgres or sqlinbox.SQLite)", idem.ErrConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Window < 0 {
		return nil, fmt.Errorf("%w: sqlinbox: window %v must be positive", idem.ErrConfig, c.Window)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	t, err := parseTable(c.Table, dialect.schemas())
	if err != nil {
		return nil, fmt.Errorf("%w: sqlinbox: %w", idem.ErrConfig, err)
	}
	s := &Store{db: db, dialect: dialect, table: t}
	s.sql = dialect.statements(inboxdb.Table{Schema: t.schema, Name: t.name})
	s.inbox = &inboxdb.Inbox{D: s.sql, Driver: dialect.driver(db), Window: c.Window, Hooks: c.Hooks, Logger: c.Logger}
	w := c.Window
	if w == 0 {
		w = retention.DefaultWindow
	}
	s.window.Store(int64(w))
	return s, nil
}

// Window returns the retention window: the stored one once [Store.Migrate]
// or [Store.Settings] has read it, the configured one before.
func (s *Store) Window() time.Duration { return time.Duration(s.window.Load()) }

// Layout is the table's layout: always plain ([idemstore.Store.Layout]).
func (s *Store) Layout() idemstore.Layout { return idemstore.LayoutPlain }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// Table returns the inbox table's name as configured.
func (s *Store) Table() string { return s.table.String() }

// Settings reads the layout and window stored with the table
// ([idemstore.Store.Settings]).
func (s *Store) Settings(ctx context.Context) (idemstore.Settings, error) {
	set, err := s.inbox.Settings(ctx)
	if err == nil {
		s.window.Store(int64(set.Window))
	}
	return set, err
}

// SettingsIn is Settings read in tx, a transaction the caller holds
// ([idemstore.Store.SettingsIn]).
func (s *Store) SettingsIn(ctx context.Context, tx *sql.Tx) (idemstore.Settings, error) {
	set, err := s.inbox.SettingsIn(ctx, inboxdb.SQLTxConn(tx))
	if err == nil {
		s.window.Store(int64(set.Window))
	}
	return set, err
}

// SetWindow changes the window stored with the table and logs the old and
// new values; it refuses, unless force is set, a window under an hour or
// shorter than the longest horizon a consumer recorded. It returns the old
// window.
func (s *Store) SetWindow(ctx context.Context, w time.Duration, force bool) (time.Duration, error) {
	old, err := s.inbox.SetWindow(ctx, w, force)
	if err == nil {
		s.window.Store(int64(w))
	}
	return old, err
}

// WindowStatus reads the window stored with the table and the guard window
// processors may use now: the same, except after a lengthening, when the
// guard grows from the old window as markers age into the new one.
func (s *Store) WindowStatus(ctx context.Context) (stored, guard time.Duration, err error) {
	return s.inbox.Stored(ctx)
}

// RecordHorizon records the horizon consumer guards with, beside the
// settings ([idemstore.Store.RecordHorizon]).
func (s *Store) RecordHorizon(ctx context.Context, consumer string, horizon time.Duration) error {
	return s.inbox.RecordHorizon(ctx, consumer, horizon)
}

// Horizons lists the horizons consumers recorded, longest first.
func (s *Store) Horizons(ctx context.Context) ([]retention.RecordedHorizon, error) {
	return s.inbox.Horizons(ctx)
}

// Begin starts a transaction. database/sql rolls a transaction back the
// moment its begin context ends, which would turn a processor's deliberate
// "finish the commit while shutting down" into a commit of unknown outcome;
// so the transaction runs on a context detached from ctx. Getting a
// connection and sending BEGIN still obey ctx: a saturated pool or an
// unreachable server cannot hold a shutdown. Statements inside obey their
// own contexts, and the processor always ends the transaction.
func (s *Store) Begin(ctx context.Context) (*sql.Tx, error) {
	txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	tx, err := s.db.BeginTx(txCtx, nil)
	if !stop() {
		// ctx ended while beginning: txCtx is (being) cancelled, and
		// database/sql rolls back whatever began.
		if err == nil {
			_ = tx.Rollback()
		}
		return nil, fmt.Errorf("beginning transaction: %w", context.Cause(ctx))
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("beginning transaction: %w", err)
	}
	return tx, nil
}

// Commit commits tx. On PostgreSQL, a failure without an answer from the
// server (the connection broke), or with a FATAL one (the server ended the
// session, possibly after the commit was durable), wraps
// [idemstore.ErrCommitUnknown]: the transaction may have committed. An ERROR
// answer means it was rolled back. On SQLite a failed commit did not commit.
func (s *Store) Commit(_ context.Context, tx *sql.Tx) error {
	err := tx.Commit()
	if err == nil {
		return nil
	}
	if s.dialect.commitUnknown(err) {
		return fmt.Errorf("committing: %w: %w", idemstore.ErrCommitUnknown, err)
	}
	return fmt.Errorf("committing: %w", err)
}

// Rollback rolls tx back. A transaction that is already over (committed,
// rolled back, or ended by a failed statement and the driver) is not an
// error.
func (s *Store) Rollback(_ context.Context, tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("rolling back: %w", err)
	}
	return nil
}

func timestamptz(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// Claim inserts the markers in one statement per chunk of claims (one chunk
// unless the batch exceeds the dialect's parameter limit), in the order given,
// and reports which ones this transaction inserted.
func (s *Store) Claim(ctx context.Context, tx *sql.Tx, consumer string, claims []idemstore.Claim, lockTimeout time.Duration) ([]bool, error) {
	inserted := make([]bool, len(claims))
	if len(claims) == 0 {
		return inserted, nil
	}
	if m, ok := s.dialect.(mysqlDialect); ok {
		return inserted, m.claim(ctx, tx, s.sql, consumer, claims, lockTimeout, inserted)
	}
	if lockTimeout > 0 {
		if err := s.dialect.setLockTimeout(ctx, tx, lockTimeout); err != nil {
			return nil, fmt.Errorf("setting lock timeout: %w", err)
		}
	}
	chunk := len(claims)
	if s.sql.Claim.SQL == "" {
		chunk = s.dialect.maxParams() / s.sql.Claim.RowParams
	}
	for start := 0; start < len(claims); start += chunk {
		end := min(start+chunk, len(claims))
		if err := s.claimChunk(ctx, tx, consumer, claims[start:end], inserted[start:end]); err != nil {
			return nil, err
		}
	}
	return inserted, nil
}

func (s *Store) claimChunk(ctx context.Context, tx *sql.Tx, consumer string, claims []idemstore.Claim, inserted []bool) error {
	var args []any
	if s.sql.Claim.SQL != "" {
		// PostgreSQL: one statement over arrays.
		keys := make([]string, len(claims))
		ids := make([]string, len(claims))
		hashes := make([][]byte, len(claims))
		times := make([]pgtype.Timestamptz, len(claims))
		for i, c := range claims {
			keys[i], ids[i], hashes[i], times[i] = c.Key, c.MessageID, body(c), timestamptz(c.EventTime)
		}
		args = []any{consumer, keys, ids, hashes, times}
	} else {
		args = make([]any, 0, len(claims)*s.sql.Claim.RowParams)
		for _, c := range claims {
			var et any
			if !c.EventTime.IsZero() {
				et = s.sql.TimeArg(c.EventTime)
			}
			args = append(args, consumer, c.Key, c.MessageID, body(c), et, et)
		}
	}
	rows, err := tx.QueryContext(ctx, s.sql.Claim.Build(len(claims)), args...)
	if err != nil {
		return fmt.Errorf("inserting inbox markers: %w", err)
	}
	defer rows.Close()
	fresh := make(map[string]bool, len(claims))
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return fmt.Errorf("reading inserted keys: %w", err)
		}
		fresh[k] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inserting inbox markers: %w", err)
	}
	// RETURNING gives no order guarantee: match by key. A key repeated in
	// the claims was inserted at most once, by its first occurrence.
	for i, c := range claims {
		if fresh[c.Key] {
			inserted[i] = true
			delete(fresh, c.Key)
		}
	}
	return nil
}

// body is a claim's body hash; the column is NOT NULL, so an absent hash is
// empty.
func body(c idemstore.Claim) []byte {
	if c.BodySHA256 == nil {
		return []byte{}
	}
	return c.BodySHA256
}

// Lookup returns the markers that exist among keys, with their keep-until
// times.
func (s *Store) Lookup(ctx context.Context, tx *sql.Tx, consumer string, keys []string) (map[string]idemstore.Marker, error) {
	out := make(map[string]idemstore.Marker, len(keys))
	chunk := len(keys)
	if s.sql.Lookup.SQL == "" {
		chunk = s.dialect.maxParams() - 1
	}
	for start := 0; start < len(keys); start += chunk {
		end := min(start+chunk, len(keys))
		if err := s.lookupChunk(ctx, tx, consumer, keys[start:end], out); err != nil {
			return nil, fmt.Errorf("looking up inbox markers: %w", err)
		}
	}
	return out, nil
}

func (s *Store) lookupChunk(ctx context.Context, tx *sql.Tx, consumer string, keys []string, out map[string]idemstore.Marker) error {
	args := []any{consumer, keys}
	if s.sql.Lookup.SQL == "" {
		args = make([]any, 0, 1+len(keys))
		args = append(args, consumer)
		for _, k := range keys {
			args = append(args, k)
		}
	}
	rows, err := tx.QueryContext(ctx, s.sql.Lookup.Build(len(keys)), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var m idemstore.Marker
		var at, until any
		if err := rows.Scan(&m.Key, &m.MessageID, &m.BodySHA256, &at, &until); err != nil {
			return err
		}
		if m.ProcessedAt, err = s.sql.ScanTime(at); err != nil {
			return err
		}
		if m.KeepUntil, err = s.sql.ScanTime(until); err != nil {
			return err
		}
		out[m.Key] = m
	}
	return rows.Err()
}

// Extend raises the keep-until time of markers to the given times where
// they are later than the stored ones, in one statement (per chunk of the
// dialect's parameter limit) that writes nothing where nothing grows
// ([idemstore.Store.Extend]). A key given twice keeps its latest time.
func (s *Store) Extend(ctx context.Context, tx *sql.Tx, consumer string, ext []idemstore.Extension) error {
	keys, times := extensions(ext)
	if s.sql.Extend.SQL != "" {
		if len(keys) == 0 {
			return nil
		}
		ts := make([]pgtype.Timestamptz, len(times))
		for i, t := range times {
			ts[i] = timestamptz(t)
		}
		if _, err := tx.ExecContext(ctx, s.sql.Extend.SQL, consumer, keys, ts); err != nil {
			return fmt.Errorf("extending inbox markers: %w", err)
		}
		return nil
	}
	chunk := (s.dialect.maxParams() - 1) / s.sql.Extend.RowParams
	for start := 0; start < len(keys); start += chunk {
		end := min(start+chunk, len(keys))
		args := make([]any, 0, 1+2*(end-start))
		for i := start; i < end; i++ {
			args = append(args, keys[i], s.sql.TimeArg(times[i]))
		}
		args = append(args, consumer)
		q := s.sql.Extend.Build(end - start)
		if m, ok := s.dialect.(mysqlDialect); ok {
			q = m.buildExtend(s.sql, end-start)
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("extending inbox markers: %w", err)
		}
	}
	return nil
}

// extensions returns each key once, in key order (so that two extending
// transactions lock rows in the same order), with its latest time; zero
// times are skipped.
func extensions(ext []idemstore.Extension) ([]string, []time.Time) {
	latest := make(map[string]time.Time, len(ext))
	for _, e := range ext {
		if e.KeepUntil.IsZero() {
			continue
		}
		if t, ok := latest[e.Key]; !ok || e.KeepUntil.After(t) {
			latest[e.Key] = e.KeepUntil
		}
	}
	keys := make([]string, 0, len(latest))
	for k := range latest {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	times := make([]time.Time, len(keys))
	for i, k := range keys {
		times[i] = latest[k]
	}
	return keys, times
}

// Durability reads the settings that decide whether a commit the database
// acknowledged survives a crash or a failover ([idemstore.Store.Durability]);
// a consumer logs each risk at start and idem inbox check prints it.
// PostgreSQL: synchronous_commit, synchronous_standby_names, fsync and the
// streaming standbys (see pgxinbox's Store.Durability). MySQL and MariaDB:
// innodb_flush_log_at_trx_commit, sync_binlog with the binary log on, the
// replicas connected (seen with the PROCESS privilege) and
// semi-synchronous replication with its fallback timeout. SQLite: the
// synchronous pragma.
func (s *Store) Durability(ctx context.Context) (idemstore.Durability, error) {
	d, err := s.dialect.durability(ctx, s.db)
	if err != nil {
		return idemstore.Durability{}, fmt.Errorf("sqlinbox: reading durability settings: %w", err)
	}
	return d, nil
}

// Classify tells transient from permanent errors by driver error type and
// code: on PostgreSQL by SQLSTATE (see package internal/pgerr); on SQLite
// SQLITE_CONSTRAINT, SQLITE_MISMATCH and SQLITE_TOOBIG are permanent.
// Everything else, including errors that are not the database's, is
// transient.
func (s *Store) Classify(err error) idemstore.ErrorClass { return s.dialect.classify(err) }

// PrunedSummaries returns consumer's summaries of the keys prunes deleted,
// newest first: the processor loads them with the settings and checks every
// fresh key against them (idemstore.Store.PrunedSummaries,
// idem.Config.RefuseLate).
func (s *Store) PrunedSummaries(ctx context.Context, consumer string) ([]idemstore.PrunedSummary, error) {
	return s.inbox.PrunedSummaries(ctx, consumer)
}

// PrunedSummariesIn is PrunedSummaries read in tx, a transaction the
// caller holds ([idemstore.Store.SettingsIn]).
func (s *Store) PrunedSummariesIn(ctx context.Context, tx *sql.Tx, consumer string) ([]idemstore.PrunedSummary, error) {
	return s.inbox.PrunedSummariesIn(ctx, inboxdb.SQLTxConn(tx), consumer)
}

// Ping asks the database whether it answers, on a pooled connection
// ([idemstore.Store.Ping]).
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// NeedsCommit is false: a claim leaves nothing in a transaction that only
// its COMMIT completes ([idemstore.Store.NeedsCommit]).
func (*Store) NeedsCommit(*sql.Tx) bool { return false }

// RecordPositions records consumer's position in each source of ps, in tx
// ([idemstore.Store.RecordPositions]).
func (s *Store) RecordPositions(ctx context.Context, tx *sql.Tx, consumer string, ps []idemstore.Position) error {
	return s.inbox.RecordPositions(ctx, inboxdb.SQLTxConn(tx), consumer, ps)
}

// Positions returns the positions recorded for consumer, by source
// ([idemstore.Store.Positions]).
func (s *Store) Positions(ctx context.Context, consumer string) ([]idemstore.Position, error) {
	return s.inbox.Positions(ctx, consumer)
}

// ForgetPositions deletes the positions recorded for consumer
// ([idemstore.Store.ForgetPositions]).
func (s *Store) ForgetPositions(ctx context.Context, consumer string) (int64, error) {
	return s.inbox.ForgetPositions(ctx, consumer)
}
