package audit

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// conn is what the operations run statements through, whatever the driver:
// a pool, a connection or a transaction.
type conn interface {
	exec(ctx context.Context, sql string, args ...any) (int64, error)
	query(ctx context.Context, sql string, args ...any) (rowSet, error)
	queryRow(ctx context.Context, sql string, args ...any) rowScanner
}

type rowSet interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// rowScanner scans one row; a missing row is errNoRows whatever the driver.
type rowScanner interface {
	Scan(dest ...any) error
}

var errNoRows = errors.New("no rows")

// txConn is a transaction.
type txConn interface {
	conn
	commit(ctx context.Context) error
	// rollback also releases what begin took (a dedicated connection); it
	// is called after commit too, and is then a no-op on the transaction.
	rollback(ctx context.Context) error
}

// txMode is how an operation's transaction reads: read only (a report, a
// dry run) or writing (a void that applies).
type txMode int

const (
	readOnly txMode = iota
	readWrite
)

// backend is a database connection pool of one engine.
type backend interface {
	conn
	begin(ctx context.Context, mode txMode) (txConn, error)
	// session runs f on one connection of its own, for statements that
	// depend on session settings.
	session(ctx context.Context, f func(conn) error) error
}

// pgBackend runs on pgx.
type pgBackend struct{ db DB }

type pgConn struct{ q querier }

func (c pgConn) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := c.q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (c pgConn) query(ctx context.Context, sql string, args ...any) (rowSet, error) {
	return c.q.Query(ctx, sql, args...)
}

func (c pgConn) queryRow(ctx context.Context, sql string, args ...any) rowScanner {
	return pgRow{c.q.QueryRow(ctx, sql, args...)}
}

type pgRow struct{ r pgx.Row }

func (r pgRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return errNoRows
	}
	return err
}

func (b pgBackend) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return pgConn{b.db}.exec(ctx, sql, args...)
}

func (b pgBackend) query(ctx context.Context, sql string, args ...any) (rowSet, error) {
	return pgConn{b.db}.query(ctx, sql, args...)
}

func (b pgBackend) queryRow(ctx context.Context, sql string, args ...any) rowScanner {
	return pgConn{b.db}.queryRow(ctx, sql, args...)
}

func (b pgBackend) begin(ctx context.Context, mode txMode) (txConn, error) {
	access := pgx.ReadOnly
	if mode == readWrite {
		access = pgx.ReadWrite
	}
	tx, err := b.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: access})
	if err != nil {
		return nil, err
	}
	return pgTx{pgConn{tx}, tx}, nil
}

func (b pgBackend) session(ctx context.Context, f func(conn) error) error {
	return f(pgConn{b.db})
}

type pgTx struct {
	pgConn
	tx pgx.Tx
}

func (t pgTx) commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgTx) rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// pgDuplicate reports a unique violation and its detail.
func pgDuplicate(err error) (string, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return pe.Detail, true
	}
	return "", false
}

// pgConflict reports a serialization failure or deadlock.
func pgConflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}
