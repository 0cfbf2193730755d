package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// listenOn LISTENs on channel with conn and calls wake on every
// notification until ctx is done or the connection fails. The caller
// closes conn afterwards: it still listens.
func listenOn(ctx context.Context, conn *pgx.Conn, channel string, wake func()) error {
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("listening on %s: %w", channel, err)
	}
	// The channel may have been notified before LISTEN took effect.
	wake()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}

// listenSQL is listenOn over a connection of a database/sql pool opened
// with the pgx stdlib driver. The connection is discarded afterwards, never
// handed back to the pool still listening.
func listenSQL(ctx context.Context, db *sql.DB, channel string, wake func()) error {
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("LISTEN needs the pgx stdlib driver, not %T", dc)
		}
		// Whatever ended the wait, the session must not be reused.
		return fmt.Errorf("%w (%w)", driver.ErrBadConn, listenOn(ctx, pc.Conn(), channel, wake))
	})
}
