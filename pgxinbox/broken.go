package pgxinbox

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Broken reports whether tx's connection is closed, or its server says it
// cannot write (a hot standby, a primary fenced read-only in a failover):
// after a handler's failure, the processor then knows the database went
// away under it (an outage, which spends none of the message's attempts)
// rather than the handler failing on a live transaction. A natural
// consumer, which claims nothing, meets a read-only server first in its
// handler.
func (s *Store) Broken(tx pgx.Tx) bool {
	if pt, ok := tx.(*pendingTx); ok {
		return pt.conn.IsClosed() || readOnlyServer(pt.conn) // Conn would begin one not begun
	}
	c := tx.Conn()
	return c == nil || c.IsClosed() || readOnlyServer(c)
}

// Ping asks the database a trivial question on a pooled connection
// ([idemstore.Store.Ping]).
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.db.Exec(ctx, "SELECT 1")
	return err
}
