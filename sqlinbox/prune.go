package sqlinbox

import (
	"context"

	"github.com/idemkit/idem/retention"
)

// Prune forgets the markers whose keep_until is older than the window stored
// with the table, in batches of opts.BatchSize, each its own short
// transaction; package retention explains why that never lets a duplicate
// through a consumer guarding with the same window. opts.Window may ask for
// a longer window; a shorter one is refused with an error wrapping
// [retention.ErrShortWindow].
//
// On PostgreSQL one instance prunes a table at a time: the others find the
// advisory lock taken (the same lock as pgxinbox's) and return at once with
// Result.Skipped; on MySQL and MariaDB the same with a named lock
// (GET_LOCK). On SQLite, writers already take turns on the database lock. The cut-off is the database's clock, which wrote keep_until.
func (s *Store) Prune(ctx context.Context, opts retention.Options) (retention.Result, error) {
	return s.inbox.Prune(ctx, opts)
}

// Stats reads the inbox's size and the age of its oldest marker (by
// keep_until) for the stored window, and reports that age to the hooks. It
// scans the table once.
func (s *Store) Stats(ctx context.Context) (retention.Stats, error) {
	return s.inbox.Stats(ctx)
}
