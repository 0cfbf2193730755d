package inboxdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/migrator"
)

// pgxConn is the [Conn] of a pgx transaction or connection.
type pgxConn = migrator.PgxConn

// PgxTxConn is the [Conn] of a pgx transaction, for shared logic that runs
// inside a store's own transaction.
func PgxTxConn(tx pgx.Tx) Conn { return pgxConn{Q: tx} }

type pgxTx struct {
	pgxConn
	tx pgx.Tx
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// PgxDB is what pgxinbox's Driver needs: *pgxpool.Pool and *pgx.Conn.
type PgxDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Pgx is the [Driver] of a pgx pool or connection.
func Pgx(db PgxDB) Driver { return pgxDriver{db} }

type pgxDriver struct{ db PgxDB }

func (p pgxDriver) Begin(ctx context.Context) (Tx, error) {
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTx{pgxConn{Q: tx}, tx}, nil
}

func (p pgxDriver) Read(ctx context.Context, f func(Conn) error) error {
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := Cleanup(ctx)
		defer cancel()
		_ = tx.Rollback(ctx)
	}()
	return f(pgxConn{Q: tx})
}

// BeginMigration begins; the dialect's first bookkeeping statement takes
// the migration lock.
func (p pgxDriver) BeginMigration(ctx context.Context) (Tx, error) { return p.Begin(ctx) }

// pgxSession is the leader's session of a pgx pool or connection.
type pgxSession struct {
	pgxConn
	conn *pgx.Conn
}

func (s pgxSession) BeginBatch(ctx context.Context) (Tx, error) {
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTx{pgxConn{Q: tx}, tx}, nil
}

func (p pgxDriver) Lead(ctx context.Context, d *Dialect) (Session, func(), bool, error) {
	var conn *pgx.Conn
	giveBack := func() {}
	switch db := p.db.(type) {
	case *pgxpool.Pool:
		c, err := db.Acquire(ctx)
		if err != nil {
			return nil, nil, false, err
		}
		conn, giveBack = c.Conn(), c.Release
	case *pgx.Conn:
		conn = db
	default:
		return nil, nil, false, errors.New("the store's DB must be a *pgxpool.Pool or a *pgx.Conn to prune (the prune lock lives on one session)")
	}
	var ok bool
	if err := conn.QueryRow(ctx, d.TryLock, d.Table.Quoted()).Scan(&ok); err != nil || !ok {
		giveBack()
		if err != nil {
			return nil, nil, false, fmt.Errorf("taking the prune lock: %w", err)
		}
		return nil, nil, false, nil
	}
	release := func() {
		ctx, cancel := Cleanup(ctx)
		defer cancel()
		if _, err := conn.Exec(ctx, d.Unlock, d.Table.Quoted()); err != nil {
			// A connection still holding the lock must not go back to the
			// pool: other instances would never prune again.
			_ = conn.Close(ctx)
		}
		giveBack()
	}
	return pgxSession{pgxConn{Q: conn}, conn}, release, true, nil
}

// sqlConn is the [Conn] of a database/sql pool, connection or transaction.
type sqlConn = migrator.SQLConn

// SQLTxConn is the [Conn] of a database/sql transaction, for shared logic
// that runs inside a caller's own transaction.
func SQLTxConn(tx *sql.Tx) Conn { return sqlConn{Q: tx} }

type sqlTx struct {
	sqlConn
	commit, rollback func() error
}

func (t sqlTx) Commit(context.Context) error   { return t.commit() }
func (t sqlTx) Rollback(context.Context) error { return t.rollback() }

// SQL is the [Driver] of a database/sql pool. immediate is set for SQLite:
// its migration transaction is BEGIN IMMEDIATE on one pinned connection,
// which takes the write lock at once whatever the DSN says, so that two
// migrators queue (busy_timeout) instead of both reading version 0. Without
// it (PostgreSQL) migrations run in a plain transaction whose first
// statement takes an advisory lock, and the prune election is an advisory
// lock on one session; on SQLite writers already take turns, so every
// instance prunes.
func SQL(db *sql.DB, immediate bool) Driver { return sqlDriver{db, immediate} }

type sqlDriver struct {
	db        *sql.DB
	immediate bool
}

func (s sqlDriver) Begin(ctx context.Context) (Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return sqlTx{sqlConn{Q: tx}, tx.Commit, func() error {
		if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
			return err
		}
		return nil
	}}, nil
}

func (s sqlDriver) Read(ctx context.Context, f func(Conn) error) error {
	return f(sqlConn{Q: s.db})
}

func (s sqlDriver) BeginMigration(ctx context.Context) (Tx, error) {
	if !s.immediate {
		return s.Begin(ctx)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("beginning immediate transaction: %w", err)
	}
	done := false
	end := func(stmt string) error {
		if done {
			return nil
		}
		done = true
		_, err := conn.ExecContext(context.Background(), stmt)
		if err != nil {
			// Never hand a connection with an open transaction back to the
			// pool: discard it.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		return errors.Join(err, conn.Close())
	}
	return sqlTx{sqlConn{Q: conn}, func() error { return end("COMMIT") }, func() error { return end("ROLLBACK") }}, nil
}

func (s sqlDriver) Lead(ctx context.Context, d *Dialect) (Session, func(), bool, error) {
	if d.TryLock == "" {
		// SQLite: writers take turns on the database lock, so every
		// instance prunes; a batch is an IMMEDIATE transaction on one
		// connection, taken for the batch only.
		return sqlSession{sqlConn{Q: s.db}, s.BeginMigration}, func() {}, true, nil
	}
	conn, release, ok, err := LockedConn(ctx, s.db, d)
	if err != nil || !ok {
		return nil, nil, ok, err
	}
	return sqlSession{sqlConn{Q: conn}, func(ctx context.Context) (Tx, error) { return SQLConnTx(ctx, conn, nil) }}, release, true, nil
}

// sqlSession is the leader's session of a database/sql pool.
type sqlSession struct {
	sqlConn
	begin func(context.Context) (Tx, error)
}

func (s sqlSession) BeginBatch(ctx context.Context) (Tx, error) { return s.begin(ctx) }

// SQLConnTx begins a transaction on conn, with opts.
func SQLConnTx(ctx context.Context, conn *sql.Conn, opts *sql.TxOptions) (Tx, error) {
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return sqlTx{sqlConn{Q: tx}, tx.Commit, func() error {
		if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
			return err
		}
		return nil
	}}, nil
}

// LockedConn takes d's prune lock (TryLock) on a session of its own from
// db, for a driver's Lead: the session, the release that unlocks and
// closes it, and false when another session holds the lock.
func LockedConn(ctx context.Context, db *sql.DB, d *Dialect) (*sql.Conn, func(), bool, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	var ok bool
	if err := conn.QueryRowContext(ctx, d.TryLock, d.Table.Quoted()).Scan(&ok); err != nil || !ok {
		_ = conn.Close()
		if err != nil {
			return nil, nil, false, fmt.Errorf("taking the prune lock: %w", err)
		}
		return nil, nil, false, nil
	}
	release := func() {
		ctx, cancel := Cleanup(ctx)
		defer cancel()
		if _, err := conn.ExecContext(ctx, d.Unlock, d.Table.Quoted()); err != nil {
			// Never hand a connection that may still hold the lock back to
			// the pool.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}
	return conn, release, true, nil
}
