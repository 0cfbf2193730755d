package sqlinbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/internal/migrator"
)

// mysqlDriver is the database/sql driver of package inboxdb with what MySQL
// needs besides:
//
//   - Migrations are serialized by a named lock (GET_LOCK), which belongs
//     to the session rather than to a transaction, so it outlives the
//     implicit commits of the DDL the migration runs: the migrator holds it
//     on one connection from before it reads the schema version until after
//     it has recorded the settings.
//   - On MySQL (not MariaDB) a prune batch is a SELECT ... FOR UPDATE of
//     the oldest keys by the keep_until index, then a DELETE of those keys,
//     in one transaction: MySQL has no DELETE ... RETURNING, and the keys a
//     prune deletes must be known to summarise them. On both, the batch's
//     transaction is READ COMMITTED (see [mysqlBatchTx]).
type mysqlDriver struct {
	inboxdb.Driver
	db      *sql.DB
	mariadb bool
}

func newMySQLDriver(db *sql.DB, mariadb bool) inboxdb.Driver {
	return mysqlDriver{Driver: inboxdb.SQL(db, false), db: db, mariadb: mariadb}
}

// BeginMigration takes the migration lock on a connection of its own, then
// begins the migration's transaction on it. Commit and Rollback end the
// transaction, release the lock and give the connection back.
func (m mysqlDriver) BeginMigration(ctx context.Context) (inboxdb.Tx, error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if err := migrator.GetMySQLLock(ctx, conn); err != nil {
		_ = conn.Close()
		if errors.Is(err, migrator.ErrMySQLNoDatabase) {
			return nil, fmt.Errorf("%w: %w", idem.ErrConfig, err)
		}
		return nil, err
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		m.release(conn)
		return nil, err
	}
	done := false
	end := func(finish func() error) error {
		if done {
			return nil
		}
		done = true
		err := finish()
		if errors.Is(err, sql.ErrTxDone) {
			err = nil
		}
		m.release(conn)
		return err
	}
	return mysqlTx{Conn: inboxdb.SQLTxConn(tx), commit: func() error { return end(tx.Commit) }, rollback: func() error { return end(tx.Rollback) }}, nil
}

// release gives the migration lock up and the connection back; a
// connection that may still hold the lock is discarded instead, which
// ends its session and so the lock.
func (m mysqlDriver) release(conn *sql.Conn) {
	if err := migrator.ReleaseMySQLLock(conn); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = conn.Close()
}

type mysqlTx struct {
	inboxdb.Conn
	commit, rollback func() error
}

func (t mysqlTx) Commit(context.Context) error   { return t.commit() }
func (t mysqlTx) Rollback(context.Context) error { return t.rollback() }

// Lead is the prune election of package inboxdb (a named lock held by the
// leader's session); each prune batch is a transaction on that session, as
// [mysqlBatchTx] runs it.
func (m mysqlDriver) Lead(ctx context.Context, d *inboxdb.Dialect) (inboxdb.Session, func(), bool, error) {
	conn, release, ok, err := inboxdb.LockedConn(ctx, m.db, d)
	if err != nil || !ok {
		return nil, nil, ok, err
	}
	return mysqlSession{Conn: connOf{conn}, conn: conn, d: d, mariadb: m.mariadb}, release, true, nil
}

// mysqlPruneBatch is MySQL's prune batch (see [mysqlBatchTx]): the
// cut-off and the batch size → the consumer and key of the oldest markers
// past the cut-off, locked. It reads the keep_until index in its order, as
// the DELETE ... ORDER BY keep_until LIMIT of MariaDB does.
func mysqlPruneBatch(t inboxdb.Table) string {
	return `SELECT consumer, "key" FROM ` + t.Quoted() + ` WHERE keep_until < ? ORDER BY keep_until LIMIT ? FOR UPDATE`
}

// mysqlPruneDelete deletes n locked markers, by primary key.
func mysqlPruneDelete(t inboxdb.Table, n int) string {
	var b strings.Builder
	b.WriteString(`DELETE FROM ` + t.Quoted() + ` WHERE (consumer, "key") IN (`)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?)")
	}
	b.WriteString(")")
	return b.String()
}

// mysqlSession is the leader's session.
type mysqlSession struct {
	inboxdb.Conn
	conn    *sql.Conn
	d       *inboxdb.Dialect
	mariadb bool
}

// BeginBatch begins a prune batch's transaction on the leader's session, at
// READ COMMITTED (see [mysqlBatchTx]).
func (s mysqlSession) BeginBatch(ctx context.Context) (inboxdb.Tx, error) {
	tx, err := inboxdb.SQLConnTx(ctx, s.conn, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	return mysqlBatchTx{Tx: tx, d: s.d, mariadb: s.mariadb}, nil
}

// mysqlBatchTx is one prune batch's transaction. Every statement runs as in
// any transaction, except the dialect's PruneBatch: on MySQL that is the
// SELECT ... FOR UPDATE of the batch's keys and a DELETE of exactly those
// (in chunks of mysqlPruneChunk), whose keys it hands to the caller as rows,
// as DELETE ... RETURNING would; the rows stay locked until the batch's
// COMMIT, so no claim or extension changes one in between, and the keys
// handed back are the keys deleted. On MariaDB it is the DELETE ...
// RETURNING itself.
//
// READ COMMITTED, because at REPEATABLE READ (InnoDB's default) a locking
// scan of the keep_until index also locks the gap before the first record
// past the cut-off, or the end of the index when every marker expired: a
// claim or an extension whose keep_until falls there (the first claims
// after a pause longer than the window; a message whose event time is
// older than the newest markers') would wait for the batch to commit, or
// until innodb_lock_wait_timeout. READ COMMITTED locks the matching rows
// only, and the batch needs no more: a marker inserted into the range
// after its scan was not selected and is not deleted.
type mysqlBatchTx struct {
	inboxdb.Tx
	d       *inboxdb.Dialect
	mariadb bool
}

// mysqlPruneChunk is how many keys one DELETE of a MySQL prune batch names.
// A long list of row constructors can exceed range_optimizer_max_mem_size,
// and the server then scans the whole table instead, locking every row; a
// thousand pairs stay far below its default (8 MiB).
const mysqlPruneChunk = 1000

// mysqlPruneLocked, when set (by tests), runs while a prune batch holds its
// rows, before its COMMIT.
var mysqlPruneLocked func()

func (t mysqlBatchTx) Query(ctx context.Context, query string, each func(inboxdb.Row) error, args ...any) error {
	if query != t.d.PruneBatch {
		return t.Tx.Query(ctx, query, each, args...)
	}
	var keys []keyRow
	err := t.Tx.Query(ctx, query, func(r inboxdb.Row) error {
		var k keyRow
		if err := r.Scan(&k.consumer, &k.key); err != nil {
			return err
		}
		keys = append(keys, k)
		return nil
	}, args...)
	if err != nil {
		return err
	}
	if !t.mariadb {
		if err := t.deleteLocked(ctx, keys); err != nil {
			return err
		}
	}
	if mysqlPruneLocked != nil {
		mysqlPruneLocked()
	}
	for _, k := range keys {
		if err := each(k); err != nil {
			return err
		}
	}
	return nil
}

// deleteLocked deletes the markers a MySQL prune batch selected and locked.
func (t mysqlBatchTx) deleteLocked(ctx context.Context, keys []keyRow) error {
	for start := 0; start < len(keys); start += mysqlPruneChunk {
		part := keys[start:min(start+mysqlPruneChunk, len(keys))]
		del := make([]any, 0, 2*len(part))
		for _, k := range part {
			del = append(del, k.consumer, k.key)
		}
		n, err := t.Tx.Exec(ctx, mysqlPruneDelete(t.d.Table, len(part)), del...)
		if err != nil {
			return err
		}
		if n != int64(len(part)) {
			// The rows were locked: this cannot happen unless something
			// bypassed the locks. Delete nothing rather than summarise keys
			// that were not deleted.
			return fmt.Errorf("deleted %d of %d locked markers", n, len(part))
		}
	}
	return nil
}

// keyRow is one deleted marker, read as a row of DELETE ... RETURNING
// consumer, "key" would be.
type keyRow struct{ consumer, key []byte }

func (k keyRow) Scan(dest ...any) error {
	if len(dest) != 2 {
		return fmt.Errorf("scanning a pruned key: %d destinations, want 2", len(dest))
	}
	for i, v := range [][]byte{k.consumer, k.key} {
		switch p := dest[i].(type) {
		case *string:
			*p = string(v)
		case *[]byte:
			*p = append([]byte(nil), v...)
		case *any:
			*p = append([]byte(nil), v...)
		default:
			return fmt.Errorf("scanning a pruned key into %T", dest[i])
		}
	}
	return nil
}

// connOf is the [inboxdb.Conn] of a pinned connection.
type connOf struct{ c *sql.Conn }

func (c connOf) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	r, err := c.c.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func (c connOf) QueryRow(ctx context.Context, query string, args ...any) inboxdb.Row {
	return c.c.QueryRowContext(ctx, query, args...)
}

func (c connOf) Query(ctx context.Context, query string, each func(inboxdb.Row) error, args ...any) error {
	rows, err := c.c.QueryContext(ctx, query, args...)
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
