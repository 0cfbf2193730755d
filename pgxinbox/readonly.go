package pgxinbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// A failover leaves sessions on servers that cannot write: a hot standby not
// promoted yet (reached through a multi-host URL without
// target_session_attrs=read-write, or a standby's own address), or an old
// primary fenced with default_transaction_read_only. Every claim there fails
// with 25006, an outage (pgerr.Classify), and would fail again on the same
// session: so the store never gives such a connection back to its pool. The
// pool dials again, and a multi-host URL with target_session_attrs=read-write
// lands on whichever node is primary now.

// readOnlyServer reports whether conn's server says it cannot write: a hot
// standby (in_hot_standby, reported by PostgreSQL 14 and later) or a session
// whose transactions are read-only by default (default_transaction_read_only,
// reported likewise, also when a reload changes it).
func readOnlyServer(conn *pgx.Conn) bool {
	pc := conn.PgConn()
	return pc.ParameterStatus("in_hot_standby") == "on" || pc.ParameterStatus("default_transaction_read_only") == "on"
}

// dropTimeout bounds the goodbye to a read-only server whose session is
// dropped.
const dropTimeout = time.Second

// drop closes a pooled connection that cannot serve a writer, before it goes
// back to the pool, which then destroys it. A lone connection ([DB] is a
// *pgx.Conn) is the caller's and is kept.
func (t *pendingTx) drop() {
	if t.release == nil || t.conn.IsClosed() {
		return
	}
	if !t.readOnly && !readOnlyServer(t.conn) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
	defer cancel()
	_ = t.conn.Close(ctx)
}
