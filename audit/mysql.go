package audit

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// NewMySQL is [New] for a MySQL (8.0 or later) or MariaDB (10.6 or later)
// database opened with github.com/go-sql-driver/mysql. A table name without
// a schema is looked up in the connection's current database.
//
// What differs from PostgreSQL:
//
//   - Keys compare in their columns' collation, as the guard's unique index
//     will: under a case-insensitive collation "a" and "A" are one key.
//     Statuses compare as bytes.
//   - The table needs an id column ([NoColumn] is refused: MySQL has no row
//     address to name a row by).
//   - [Auditor.Void] with Apply runs at SERIALIZABLE, where InnoDB takes a
//     shared lock on every row (and gap) it reads: the rows listed are then
//     the rows updated, and a concurrent writer waits for the void (bounded
//     by LockTimeout, which sets innodb_lock_wait_timeout and
//     lock_wait_timeout, in whole seconds) or fails it with
//     [ErrConcurrentChange]. AddColumns adds the columns before the
//     transaction, since MySQL DDL commits: they stay if the void then
//     fails.
//   - [Auditor.Guard] cannot build a partial index: it adds a virtual
//     generated column, idem_live, that is 1 for a live row and NULL for a
//     voided one (NULL status counts as live, so it is fenced too), and a
//     unique index on the key plus idem_live; a unique index allows any
//     number of NULLs. Both are built with ALGORITHM=INPLACE, LOCK=NONE:
//     writes go on during the build, but InnoDB takes an exclusive metadata
//     lock on the table briefly at the start and at the end of each
//     statement, which waits for every open transaction that has touched
//     the table and, while it waits, holds up every new query on it. The
//     guard sets lock_wait_timeout to 10s for its session, so a long
//     transaction fails the guard rather than stalling the table. A
//     duplicate written during the build fails it with [ErrViolations];
//     InnoDB then drops the partial index itself.
//   - Times are read in UTC: the session's time_zone is set to +00:00, so
//     TIMESTAMP columns convert and DATETIME columns are taken as UTC.
func NewMySQL(db *sql.DB, spec Spec) (*Auditor, error) {
	p, err := compile(spec)
	if err != nil {
		return nil, err
	}
	if p.id == nil {
		return nil, fmt.Errorf("%w: on MySQL the table needs an id column (there is no row address to name rows by)", ErrInvalidSpec)
	}
	return &Auditor{db: mysqlBackend{db}, p: p, d: mysqlDialect{}}, nil
}

// mysqlGuardLockWait bounds the guard's metadata lock waits.
const mysqlGuardLockWait = 10 * time.Second

// liveColumn is the generated column the MySQL guard indexes.
const liveColumn = "idem_live"

type sqlRunner interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// mysqlConn runs the dialect's statements, rewriting $n to ? (a []string
// argument becomes one ? per element, for IN lists).
type mysqlConn struct{ r sqlRunner }

func (c mysqlConn) exec(ctx context.Context, q string, args ...any) (int64, error) {
	q, args = bindMySQL(q, args)
	res, err := c.r.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c mysqlConn) query(ctx context.Context, q string, args ...any) (rowSet, error) {
	q, args = bindMySQL(q, args)
	rows, err := c.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return mysqlRows{rows}, nil
}

func (c mysqlConn) queryRow(ctx context.Context, q string, args ...any) rowScanner {
	rows, err := c.query(ctx, q, args...)
	return mysqlRow{rows, err}
}

type mysqlRows struct{ r *sql.Rows }

func (r mysqlRows) Next() bool { return r.r.Next() }
func (r mysqlRows) Err() error { return r.r.Err() }
func (r mysqlRows) Close()     { _ = r.r.Close() }
func (r mysqlRows) Scan(dest ...any) error {
	d := make([]any, len(dest))
	for i, v := range dest {
		switch v := v.(type) {
		case *time.Time:
			d[i] = &timeScanner{dst: v}
		case **time.Time:
			d[i] = &timeScanner{ptr: v}
		default:
			d[i] = v
		}
	}
	return r.r.Scan(d...)
}

type mysqlRow struct {
	rows rowSet
	err  error
}

func (r mysqlRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return errNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	return r.rows.Err()
}

// timeScanner reads a MySQL date or time as UTC, whether the driver sends
// text (the default) or time.Time (parseTime=true).
type timeScanner struct {
	dst *time.Time
	ptr **time.Time
}

func (s *timeScanner) Scan(src any) error {
	var t time.Time
	switch v := src.(type) {
	case nil:
		if s.ptr != nil {
			*s.ptr = nil
			return nil
		}
		return fmt.Errorf("NULL time")
	case time.Time:
		t = v
	case []byte, string:
		text := fmt.Sprint(src)
		if b, ok := src.([]byte); ok {
			text = string(b)
		}
		var err error
		if t, err = time.ParseInLocation("2006-01-02 15:04:05.999999999", text, time.UTC); err != nil {
			if t, err = time.ParseInLocation("2006-01-02", text, time.UTC); err != nil {
				return fmt.Errorf("reading a time: %q", text)
			}
		}
	default:
		return fmt.Errorf("reading a time from %T", src)
	}
	if s.ptr != nil {
		*s.ptr = &t
	} else {
		*s.dst = t
	}
	return nil
}

// bindMySQL rewrites $n placeholders (outside quotes and backticks) to ?,
// ordering args by occurrence.
func bindMySQL(q string, args []any) (string, []any) {
	var b strings.Builder
	var out []any
	var quote byte
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
			b.WriteByte(c)
		case c == '\'' || c == '`' || c == '"':
			quote = c
			b.WriteByte(c)
		case c == '$' && i+1 < len(q) && q[i+1] >= '0' && q[i+1] <= '9':
			j := i + 1
			n := 0
			for j < len(q) && q[j] >= '0' && q[j] <= '9' {
				n = n*10 + int(q[j]-'0')
				j++
			}
			arg := args[n-1]
			if list, ok := arg.([]string); ok {
				if len(list) == 0 {
					b.WriteString("NULL")
				}
				for k, v := range list {
					if k > 0 {
						b.WriteString(", ")
					}
					b.WriteByte('?')
					out = append(out, v)
				}
			} else {
				b.WriteByte('?')
				out = append(out, arg)
			}
			i = j - 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), out
}

type mysqlBackend struct{ db *sql.DB }

func (b mysqlBackend) exec(ctx context.Context, q string, args ...any) (int64, error) {
	return mysqlConn{b.db}.exec(ctx, q, args...)
}

func (b mysqlBackend) query(ctx context.Context, q string, args ...any) (rowSet, error) {
	return mysqlConn{b.db}.query(ctx, q, args...)
}

func (b mysqlBackend) queryRow(ctx context.Context, q string, args ...any) rowScanner {
	return mysqlConn{b.db}.queryRow(ctx, q, args...)
}

// session is a connection of the pool taken for one operation, with the
// session settings the audit changes as they were (the DSN may have set
// them: mysqlinbox.Open sets time_zone), to put back before it returns.
type session struct {
	c                  *sql.Conn
	tz                 string
	lockWait, innoWait int64
}

func (b mysqlBackend) acquire(ctx context.Context) (*session, error) {
	c, err := b.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	s := &session{c: c}
	if err := c.QueryRowContext(ctx, "SELECT @@session.time_zone, @@session.lock_wait_timeout, @@session.innodb_lock_wait_timeout").Scan(&s.tz, &s.lockWait, &s.innoWait); err != nil {
		_ = c.Close()
		return nil, err
	}
	return s, nil
}

// release restores the settings and returns the connection to the pool,
// or discards it when that fails.
func (s *session) release() {
	if _, err := s.c.ExecContext(context.Background(), "SET SESSION time_zone = ?, lock_wait_timeout = ?, innodb_lock_wait_timeout = ?", s.tz, s.lockWait, s.innoWait); err != nil {
		_ = s.c.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = s.c.Close()
}

func (b mysqlBackend) begin(ctx context.Context, mode txMode) (txConn, error) {
	s, err := b.acquire(ctx)
	if err != nil {
		return nil, err
	}
	c := s.c
	if _, err := c.ExecContext(ctx, "SET SESSION time_zone = '+00:00'"); err != nil {
		s.release()
		return nil, err
	}
	opts := &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	if mode == readWrite {
		opts = &sql.TxOptions{Isolation: sql.LevelSerializable}
	}
	tx, err := c.BeginTx(ctx, opts)
	if err != nil {
		s.release()
		return nil, err
	}
	return &mysqlTx{mysqlConn: mysqlConn{tx}, tx: tx, s: s}, nil
}

func (b mysqlBackend) session(ctx context.Context, f func(conn) error) error {
	s, err := b.acquire(ctx)
	if err != nil {
		return err
	}
	defer s.release()
	if _, err := s.c.ExecContext(ctx, "SET SESSION lock_wait_timeout = ?", int(mysqlGuardLockWait/time.Second)); err != nil {
		return err
	}
	return f(mysqlConn{s.c})
}

type mysqlTx struct {
	mysqlConn
	tx   *sql.Tx
	s    *session
	done bool
}

func (t *mysqlTx) commit(context.Context) error { return t.tx.Commit() }

func (t *mysqlTx) rollback(context.Context) error {
	if t.done {
		return nil
	}
	t.done = true
	err := t.tx.Rollback()
	t.s.release()
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

func mysqlErrNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

func sortStrings(s []string) { sort.Strings(s) }
