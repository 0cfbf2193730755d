package migrator

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PgxDB begins pgx transactions: a *pgxpool.Pool or a *pgx.Conn.
type PgxDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// BeginPgx begins the migration transaction on one connection of db; [Run]
// takes the lock in it.
func BeginPgx(ctx context.Context, db PgxDB) (Tx, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return PgxTx(tx), nil
}

// PgxTx is the [Tx] of a pgx transaction.
func PgxTx(tx pgx.Tx) Tx { return pgxTx{PgxConn{tx}, tx} }

// PgxQuerier is a pgx.Tx or a *pgx.Conn.
type PgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PgxConn is the [Conn] of a pgx transaction or connection, shared by
// every package that runs idem's SQL through pgx.
type PgxConn struct{ Q PgxQuerier }

// Exec runs sql and returns the rows it affected.
func (c PgxConn) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := c.Q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

// QueryRow runs sql for one row.
func (c PgxConn) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return c.Q.QueryRow(ctx, sql, args...)
}

// Query runs sql and calls each for every row.
func (c PgxConn) Query(ctx context.Context, sql string, each func(Row) error, args ...any) error {
	rows, err := c.Q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

type pgxTx struct {
	PgxConn
	tx pgx.Tx
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// MySQLLock names the lock that serializes migrators of one MySQL or
// MariaDB database (sqlinbox's migrator takes the same). Lock names belong
// to the server, not to a database, and have at most 64 characters: the name
// carries a hash of the database.
const MySQLLock = `CONCAT('idem.migrate.', SHA1(DATABASE()))`

// BeginSQL begins the migration transaction on one connection of db, held
// until Commit or Rollback, under e's lock where it is the session's: on
// SQLite BEGIN IMMEDIATE (the write lock, taken at once); on MySQL and
// MariaDB GET_LOCK, taken before the transaction and released after it, as
// the DDL a migration runs commits implicitly. On PostgreSQL it is a plain
// transaction: [Run] takes the lock.
func BeginSQL(ctx context.Context, db *sql.DB, e Engine) (Tx, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	// discard ends a session that may still hold a lock or a transaction:
	// it never goes back to the pool.
	discard := func() {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
	}
	switch e {
	case SQLite:
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("beginning immediate transaction: %w", err)
		}
		end := func(stmt string) error {
			_, err := conn.ExecContext(context.Background(), stmt)
			if err != nil {
				discard()
				return err
			}
			return conn.Close()
		}
		return &sqlTx{SQLConn: SQLConn{Q: conn}, conn: conn, commit: func() error { return end("COMMIT") }, rollback: func() error { return end("ROLLBACK") }}, nil
	case MySQL:
		if err := GetMySQLLock(ctx, conn); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		discard()
		return nil, err
	}
	end := func(finish func() error) error {
		err := finish()
		if errors.Is(err, sql.ErrTxDone) {
			err = nil
		}
		if e == MySQL {
			if rerr := ReleaseMySQLLock(conn); rerr != nil {
				discard()
				return err
			}
		}
		return errors.Join(err, conn.Close())
	}
	return &sqlTx{SQLConn: SQLConn{Q: tx}, conn: conn, commit: func() error { return end(tx.Commit) }, rollback: func() error { return end(tx.Rollback) }}, nil
}

// ErrMySQLNoDatabase is why [GetMySQLLock] fails on a connection without a
// database selected: the lock's name is derived from the database's.
var ErrMySQLNoDatabase = errors.New("the connection has no database selected (name one in the DSN: user@tcp(host:3306)/database)")

// GetMySQLLock waits on conn's session for the MySQL/MariaDB migration lock
// ([MySQLLock]), a second at a time so that a cancelled context is noticed
// and no lock wait outlives the driver's read timeout. It returns nil only
// once the session holds the lock; release it with [ReleaseMySQLLock].
func GetMySQLLock(ctx context.Context, conn *sql.Conn) error {
	for {
		var got sql.NullInt64
		var noDB bool
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+MySQLLock+`, 1), DATABASE() IS NULL`).Scan(&got, &noDB); err != nil {
			return fmt.Errorf("taking the migration lock: %w", err)
		}
		switch {
		case noDB:
			// GET_LOCK answers NULL at once when the name is NULL
			// (SHA1(NULL) is NULL): polling would spin.
			return fmt.Errorf("taking the migration lock: %w", ErrMySQLNoDatabase)
		case !got.Valid:
			return errors.New("taking the migration lock: GET_LOCK returned NULL (the session was killed, or the lock name is invalid)")
		case got.Int64 == 1:
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for the migration lock, held by another migrator: %w", err)
		}
	}
}

// ReleaseMySQLLock gives up the migration lock conn's session holds. On
// an error the session may still hold it: the caller must discard the
// connection (end its session) rather than give it back to the pool.
func ReleaseMySQLLock(conn *sql.Conn) error {
	_, err := conn.ExecContext(context.Background(), `DO RELEASE_LOCK(`+MySQLLock+`)`)
	return err
}

// SQLQuerier is a *sql.DB, *sql.Conn or *sql.Tx.
type SQLQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// SQLConn is the [Conn] of a database/sql pool, connection or transaction,
// shared by every package that runs idem's SQL through database/sql.
type SQLConn struct{ Q SQLQuerier }

// Exec runs query and returns the rows it affected.
func (c SQLConn) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	r, err := c.Q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// QueryRow runs query for one row.
func (c SQLConn) QueryRow(ctx context.Context, query string, args ...any) Row {
	return c.Q.QueryRowContext(ctx, query, args...)
}

// Query runs query and calls each for every row.
func (c SQLConn) Query(ctx context.Context, query string, each func(Row) error, args ...any) error {
	rows, err := c.Q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

type sqlTx struct {
	SQLConn
	conn             *sql.Conn
	commit, rollback func() error
	done             bool
}

func (t *sqlTx) Commit(context.Context) error {
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	return t.commit()
}

func (t *sqlTx) Rollback(context.Context) error {
	if t.done {
		return nil
	}
	t.done = true
	return t.rollback()
}
