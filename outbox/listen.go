package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

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

// listenDialed dials a session with cfg, outside any pool, and listens on
// it until ctx is done or the session fails; the session is closed
// afterwards.
func listenDialed(ctx context.Context, cfg *pgx.ConnConfig, channel string, wake func()) error {
	cfg = cfg.Copy()
	// A configuration read from a live connection carries that
	// connection's notification buffer; pgx sets this one's own.
	cfg.OnNotification = nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connecting the LISTEN session: %w", err)
	}
	defer func() {
		// Bounded: the server may be the one that stopped answering.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	return listenOn(ctx, conn, channel, wake)
}

// sqlListener LISTENs for the relays of a database/sql pool opened with
// the pgx stdlib driver, each on a session dialed outside the pool with
// the configuration of the pool's connections: it does not count against
// SetMaxOpenConns.
type sqlListener struct {
	db      *sql.DB
	channel string

	mu  sync.Mutex
	cfg *pgx.ConnConfig // read once from a connection of the pool
}

func (l *sqlListener) listen(ctx context.Context, wake func()) error {
	cfg, err := l.config(ctx)
	if err != nil {
		return err
	}
	return listenDialed(ctx, cfg, l.channel, wake)
}

// config is the connection configuration of the pool, read from one of
// its connections, which goes back to the pool at once.
func (l *sqlListener) config(ctx context.Context) (*pgx.ConnConfig, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cfg != nil {
		return l.cfg, nil
	}
	c, err := l.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the connection configuration for LISTEN: %w", err)
	}
	defer c.Close()
	err = c.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("LISTEN needs the pgx stdlib driver, not %T", dc)
		}
		l.cfg = pc.Conn().Config()
		return nil
	})
	return l.cfg, err
}
