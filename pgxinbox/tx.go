package pgxinbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pendingTx is the store's transaction on a pool or a connection. Its BEGIN
// is not sent on its own: it travels with the first statement, the claim's
// in a processor's transaction ([pgx.Batch.BeginTx]), so that a transaction
// costs one round trip less than with pgx's Begin, which waits for the
// server's answer to BEGIN. Any other first use begins with pgx's Begin.
// Once begun, everything is pgx's own transaction's.
type pendingTx struct {
	conn    *pgx.Conn
	release func() // gives a pooled connection back; nil for a lone one
	inner   pgx.Tx // pgx's transaction, once begun
	ended   bool   // committed or rolled back
	// readOnly: a statement failed because the server cannot write
	// (25006); the connection is dropped at the end (see drop).
	readOnly bool
}

// beginTx returns a transaction on db whose BEGIN waits for its first
// statement, or nil when db is neither a pool nor a connection.
func beginTx(ctx context.Context, db DB) (*pendingTx, error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		c, err := d.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return &pendingTx{conn: c.Conn(), release: c.Release}, nil
	case *pgx.Conn:
		if s := d.PgConn().TxStatus(); s != 'I' {
			return nil, fmt.Errorf("pgxinbox: the connection is already in a transaction (status %q)", s)
		}
		return &pendingTx{conn: d}, nil
	}
	return nil, nil
}

// pending reports whether BEGIN is still to be sent.
func (t *pendingTx) pending() bool { return t.inner == nil && !t.ended }

// sendBegun sends b's queries after a BEGIN, in one round trip, and makes
// the transaction it begins this one's. t must be pending; b must not
// begin a transaction itself.
func (t *pendingTx) sendBegun(ctx context.Context, queue func(b *pgx.Batch)) error {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	queue(b)
	br := t.conn.SendBatch(ctx, b)
	t.inner = br.Tx() // closed by Close when BEGIN failed
	return br.Close()
}

// begin returns pgx's transaction, beginning it when nothing has run yet.
func (t *pendingTx) begin(ctx context.Context) (pgx.Tx, error) {
	switch {
	case t.inner != nil:
		return t.inner, nil
	case t.ended:
		return nil, pgx.ErrTxClosed
	}
	inner, err := t.conn.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return nil, err
	}
	t.inner = inner
	return inner, nil
}

// end gives the connection back, once.
func (t *pendingTx) end() {
	t.ended = true
	t.drop()
	if t.release != nil {
		t.release() // a connection left in a transaction is destroyed
		t.release = nil
	}
}

func (t *pendingTx) Begin(ctx context.Context) (pgx.Tx, error) {
	inner, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return inner.Begin(ctx)
}

func (t *pendingTx) Commit(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	defer t.end()
	if t.inner == nil {
		return nil // nothing ran: nothing to commit
	}
	return t.inner.Commit(ctx)
}

func (t *pendingTx) Rollback(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	defer t.end()
	if t.inner == nil {
		return nil
	}
	return t.inner.Rollback(ctx)
}

func (t *pendingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	inner, err := t.begin(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return inner.Exec(ctx, sql, args...)
}

func (t *pendingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	inner, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return inner.Query(ctx, sql, args...)
}

func (t *pendingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	inner, err := t.begin(ctx)
	if err != nil {
		return errRow{err}
	}
	return inner.QueryRow(ctx, sql, args...)
}

func (t *pendingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	inner, err := t.begin(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return inner.SendBatch(ctx, b)
}

func (t *pendingTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	inner, err := t.begin(ctx)
	if err != nil {
		return 0, err
	}
	return inner.CopyFrom(ctx, table, columns, src)
}

func (t *pendingTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	inner, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return inner.Prepare(ctx, name, sql)
}

// beginTimeout bounds the BEGIN that LargeObjects and Conn send when they
// are the first use of the transaction: they take no context.
const beginTimeout = 30 * time.Second

// beginNow begins a transaction not begun, for the methods without a
// context.
func (t *pendingTx) beginNow() (pgx.Tx, error) {
	if !t.pending() {
		return t.begin(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), beginTimeout)
	defer cancel()
	return t.begin(ctx)
}

func (t *pendingTx) LargeObjects() pgx.LargeObjects {
	inner, err := t.beginNow()
	if err != nil {
		// A closed transaction's large objects answer every call with the
		// error wrapping pgx.ErrTxClosed.
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		return pgx.FailedBatchResults(b, err).Tx().LargeObjects()
	}
	return inner.LargeObjects()
}

// Conn returns the connection. Statements sent on it directly are in the
// transaction: it begins first when nothing has run yet.
func (t *pendingTx) Conn() *pgx.Conn {
	_, _ = t.beginNow() // a failed BEGIN closes the connection, which says so
	return t.conn
}

// errRow is a row whose scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

var _ pgx.Tx = (*pendingTx)(nil)
