package pgxinbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// With synchronous replication a marker can be visible on the primary
// before the synchronous standby has it: a COMMIT waiting for the standby
// whose backend is terminated (pg_terminate_backend, a crash restart of
// the primary) or cancelled has committed locally, and its transaction
// becomes visible at once. The consumer saw that commit's outcome as
// unknown and tries again; its claim then finds the marker, a Duplicate,
// which is acknowledged without any COMMIT waiting for the standby. Should
// the primary die before the standby caught up, the promoted standby has
// neither marker nor effect, and the message is acknowledged: lost.
//
// So a claim that finds markers, on a server with synchronous standbys,
// waits until the standbys hold everything committed so far: it commits a
// transaction of its own that writes one WAL record, and a COMMIT waits
// for the standbys to flush WAL up to its own record, which comes after
// the marker's commit. Fresh claims need no such wait: their own COMMIT
// waits.

// syncStandbysSQL reports whether this session's commits wait for
// synchronous standbys.
const syncStandbysSQL = `SELECT current_setting('synchronous_standby_names') <> '' AND current_setting('synchronous_commit') IN ('on', 'remote_apply', 'remote_write')`

// standbyBarrierSQL writes one WAL record in a transaction of its own, so
// that its COMMIT waits for the synchronous standbys (a transaction that
// writes no WAL commits without waiting). pg_logical_emit_message needs no
// privilege and no logical decoding.
const standbyBarrierSQL = `SELECT pg_logical_emit_message(true, 'idem', '')`

// awaitStandbys returns once the synchronous standbys, if the server has
// any, hold every transaction committed before the call: the markers tx
// found among them. The wait runs on another connection of the pool; on a
// lone connection ([DB] is a *pgx.Conn) or a pool of one it cannot (it
// would wait for the connection tx holds), and the store relies on the
// markers' own commits.
func (s *Store) awaitStandbys(ctx context.Context, tx pgx.Tx) error {
	switch d := s.db.(type) {
	case *pgx.Conn:
		return nil
	case *pgxpool.Pool:
		if d.Config().MaxConns < 2 {
			return nil
		}
	}
	var sync bool
	if err := tx.QueryRow(ctx, syncStandbysSQL).Scan(&sync); err != nil {
		return fmt.Errorf("reading the synchronous standbys: %w", err)
	}
	if !sync {
		return nil
	}
	if _, err := s.db.Exec(ctx, standbyBarrierSQL); err != nil {
		return fmt.Errorf("waiting for the synchronous standbys to hold the markers found: %w", err)
	}
	return nil
}

// anyFound reports whether a claim found a marker it did not insert.
func anyFound(inserted []bool) bool {
	for _, in := range inserted {
		if !in {
			return true
		}
	}
	return false
}
