package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem"
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
	// Window is how long markers are kept: [Store.Prune] refuses a shorter
	// window, and [Store.Horizon] hands the same window to processors, whose
	// horizon guard then expires older messages instead of re-applying them.
	// Defaults to 14 days.
	Window time.Duration
}

// Store is an inbox on database/sql. It implements [idem.Store] with
// *sql.Tx as the transaction type, so handlers run database/sql (or sqlc)
// code in the claim's transaction. It is safe for concurrent use.
type Store struct {
	db      *sql.DB
	dialect Dialect
	table   tableName
	window  time.Duration
	// Prebuilt SQL, so the hot path only glues placeholders.
	insertHead string // INSERT INTO t (...) VALUES
	insertTail string // ON CONFLICT ... RETURNING key
	lookupHead string
}

var _ idem.Store[*sql.Tx] = (*Store)(nil)

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
	switch {
	case c.Window < 0:
		return nil, fmt.Errorf("%w: sqlinbox: window %v must be positive", idem.ErrConfig, c.Window)
	case c.Window == 0:
		c.Window = retention.DefaultWindow
	}
	t, err := parseTable(c.Table, dialect.schemas())
	if err != nil {
		return nil, fmt.Errorf("%w: sqlinbox: %w", idem.ErrConfig, err)
	}
	q := t.quoted()
	return &Store{
		db:         db,
		dialect:    dialect,
		table:      t,
		window:     c.Window,
		insertHead: "INSERT INTO " + q + " (consumer, key, message_id, body_sha256, event_time) VALUES ",
		insertTail: " ON CONFLICT (consumer, key) DO NOTHING RETURNING key",
		lookupHead: "SELECT key, message_id, body_sha256, processed_at FROM " + q + " WHERE consumer = " + dialect.placeholder(1) + " AND key IN (",
	}, nil
}

// Horizon is the horizon guard that matches the store's retention window;
// idem.NewProcessor adopts it unless the consumer sets its own.
func (s *Store) Horizon() idem.Horizon { return idem.Horizon{Window: s.window} }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// Table returns the inbox table's name as configured.
func (s *Store) Table() string { return s.table.String() }

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
// [idem.ErrCommitUnknown]: the transaction may have committed. An ERROR
// answer means it was rolled back. On SQLite a failed commit did not commit.
func (s *Store) Commit(_ context.Context, tx *sql.Tx) error {
	err := tx.Commit()
	if err == nil {
		return nil
	}
	if s.dialect.commitUnknown(err) {
		return fmt.Errorf("committing: %w: %w", idem.ErrCommitUnknown, err)
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

// claimParams is the number of bind parameters per claimed row.
const claimParams = 5

// Claim inserts the markers in one statement per chunk of claims (one chunk
// unless the batch exceeds the dialect's parameter limit), in the order given,
// and reports which ones this transaction inserted.
func (s *Store) Claim(ctx context.Context, tx *sql.Tx, consumer string, claims []idem.Claim, lockTimeout time.Duration) ([]bool, error) {
	inserted := make([]bool, len(claims))
	if len(claims) == 0 {
		return inserted, nil
	}
	if lockTimeout > 0 {
		if err := s.dialect.setLockTimeout(ctx, tx, lockTimeout); err != nil {
			return nil, fmt.Errorf("setting lock timeout: %w", err)
		}
	}
	chunk := s.dialect.maxParams() / claimParams
	for start := 0; start < len(claims); start += chunk {
		end := min(start+chunk, len(claims))
		if err := s.claimChunk(ctx, tx, consumer, claims[start:end], inserted[start:end]); err != nil {
			return nil, err
		}
	}
	return inserted, nil
}

func (s *Store) claimChunk(ctx context.Context, tx *sql.Tx, consumer string, claims []idem.Claim, inserted []bool) error {
	var b strings.Builder
	b.Grow(len(s.insertHead) + len(s.insertTail) + len(claims)*32)
	b.WriteString(s.insertHead)
	args := make([]any, 0, len(claims)*claimParams)
	for i, c := range claims {
		if i > 0 {
			b.WriteByte(',')
		}
		n := len(args)
		b.WriteByte('(')
		for j := 1; j <= claimParams; j++ {
			if j > 1 {
				b.WriteByte(',')
			}
			b.WriteString(s.dialect.placeholder(n + j))
		}
		b.WriteByte(')')
		var et any
		if !c.EventTime.IsZero() {
			et = s.dialect.timeArg(c.EventTime)
		}
		body := c.BodySHA256
		if body == nil {
			body = []byte{} // the column is NOT NULL; an absent hash is empty
		}
		args = append(args, consumer, c.Key, c.MessageID, body, et)
	}
	b.WriteString(s.insertTail)
	rows, err := tx.QueryContext(ctx, b.String(), args...)
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

// Lookup returns the markers that exist among keys.
func (s *Store) Lookup(ctx context.Context, tx *sql.Tx, consumer string, keys []string) (map[string]idem.Marker, error) {
	out := make(map[string]idem.Marker, len(keys))
	chunk := s.dialect.maxParams() - 1
	for start := 0; start < len(keys); start += chunk {
		end := min(start+chunk, len(keys))
		if err := s.lookupChunk(ctx, tx, consumer, keys[start:end], out); err != nil {
			return nil, fmt.Errorf("looking up inbox markers: %w", err)
		}
	}
	return out, nil
}

func (s *Store) lookupChunk(ctx context.Context, tx *sql.Tx, consumer string, keys []string, out map[string]idem.Marker) error {
	var b strings.Builder
	b.WriteString(s.lookupHead)
	args := make([]any, 0, 1+len(keys))
	args = append(args, consumer)
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		args = append(args, k)
		b.WriteString(s.dialect.placeholder(len(args)))
	}
	b.WriteByte(')')
	rows, err := tx.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var m idem.Marker
		var at any
		if err := rows.Scan(&m.Key, &m.MessageID, &m.BodySHA256, &at); err != nil {
			return err
		}
		if m.ProcessedAt, err = s.dialect.scanTime(at); err != nil {
			return err
		}
		out[m.Key] = m
	}
	return rows.Err()
}

// Classify tells transient from permanent errors by driver error type and
// code: on PostgreSQL SQLSTATE classes 22 (data) and 23 (constraint) are
// permanent; on SQLite SQLITE_CONSTRAINT, SQLITE_MISMATCH and SQLITE_TOOBIG.
// Everything else, including errors that are not the database's, is
// transient.
func (s *Store) Classify(err error) idem.ErrorClass { return s.dialect.classify(err) }
