package pgxinbox

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"github.com/jackc/pgx/v5"
)

// With synchronous replication a marker can be visible on the primary
// before the synchronous standby has it: a COMMIT waiting for the standby
// whose backend is terminated (pg_terminate_backend, a crash restart of
// the primary) or cancelled has committed locally, and its transaction
// becomes visible at once. The consumer saw that commit's outcome as
// unknown and tries again; its claim then finds the marker, a Duplicate,
// which would be acknowledged without any COMMIT waiting for the standby.
// Should the primary die before the standby caught up, the promoted
// standby has neither marker nor effect, and the message is acknowledged:
// lost.
//
// So a claim that finds markers, on a server whose commits wait for
// synchronous standbys, writes one WAL record in its own transaction and asks
// the processor to commit that transaction even when every message in it was
// a duplicate ([idemstore.Store.NeedsCommit]): its COMMIT waits until the
// standbys flushed WAL up to its own commit record, which comes after the
// found markers' commits. The Duplicate answers go out only after that
// COMMIT. The wait is the transaction's own, on its own session and settings,
// and takes no second connection (a second one, from the same pool, deadlocks
// a pool whose every connection holds such a claim). Claims that found
// nothing need no record: their COMMIT waits anyway.

// standbyBarrierSQL writes one WAL record in the transaction when this
// session's commits wait for synchronous standbys, and reports whether it
// did. pg_logical_emit_message needs no privilege and no logical decoding
// (it works at wal_level = replica); a transaction that writes no WAL
// would commit without waiting.
const standbyBarrierSQL = `SELECT CASE WHEN current_setting('synchronous_standby_names') <> ''
	AND current_setting('synchronous_commit') IN ('on', 'remote_apply', 'remote_write')
	THEN pg_logical_emit_message(true, 'idem', '') IS NOT NULL ELSE false END`

// barrier writes the standby barrier in tx when the server needs it.
func (s *Store) barrier(ctx context.Context, tx pgx.Tx) error {
	var wrote bool
	if err := tx.QueryRow(ctx, standbyBarrierSQL).Scan(&wrote); err != nil {
		return fmt.Errorf("marking the transaction to wait for the synchronous standbys: %w", err)
	}
	if wrote {
		s.mustCommit.mark(tx)
	}
	return nil
}

// NeedsCommit reports whether tx must be committed although every message in
// it was a duplicate ([idemstore.Store.NeedsCommit]): its claim found markers
// on a server with synchronous standbys, and only its COMMIT waits until the
// standbys hold them.
func (s *Store) NeedsCommit(tx pgx.Tx) bool { return s.mustCommit.has(tx) }

// commitNeeds holds the transactions the store began ([Store.Begin]) until
// they end ([Store.Commit], [Store.Rollback]), each with whether its claim
// wrote a standby barrier. A transaction the store did not begin (one a
// caller of idem.Processor.ProcessTx owns and commits itself) is not held:
// nothing would remove it.
type commitNeeds struct{ m sync.Map }

// A transaction of a type that cannot be a map key (a struct value of a
// DB of the caller's own holding a slice, say) is never held: its batch is
// rolled back when it holds only duplicates, as before the barrier.
func keyable(tx pgx.Tx) bool { return tx != nil && reflect.TypeOf(tx).Comparable() }

func (c *commitNeeds) begun(tx pgx.Tx) {
	if keyable(tx) {
		c.m.Store(tx, false)
	}
}

func (c *commitNeeds) mark(tx pgx.Tx) {
	if !keyable(tx) {
		return
	}
	if _, ok := c.m.Load(tx); ok {
		c.m.Store(tx, true)
	}
}

func (c *commitNeeds) has(tx pgx.Tx) bool {
	if !keyable(tx) {
		return false
	}
	v, ok := c.m.Load(tx)
	return ok && v.(bool)
}

func (c *commitNeeds) end(tx pgx.Tx) {
	if keyable(tx) {
		c.m.Delete(tx)
	}
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
