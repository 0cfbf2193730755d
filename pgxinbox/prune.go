package pgxinbox

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/retention"
)

// PruneOptions configure [Store.Prune]; see [retention.Options].
type PruneOptions = retention.Options

// Prune forgets the markers older than the window stored with the table
// (see package retention for which markers, and why that never lets a
// duplicate through the horizon guard). opts.Window may ask for a longer
// window; a shorter one is refused with an error wrapping
// [retention.ErrShortWindow].
//
// On the plain layout it deletes the markers whose keep_until is past the
// window in batches of opts.BatchSize, each its own short transaction, so
// no lock is held long and claims keep flowing. Only one instance prunes a
// table at a time: the others find its advisory lock taken and return at
// once with Result.Skipped. The store's DB must be a *pgxpool.Pool or a
// *pgx.Conn (the lock lives on one connection).
//
// On the partitioned layout it drops the partitions older than the window
// ([Store.DropPartitions]): markers of a day that straddles the cut-off stay
// until the whole day is past it, up to a day longer than the window.
func (s *Store) Prune(ctx context.Context, opts PruneOptions) (retention.Result, error) {
	if s.layout != Partitioned {
		return s.inbox.Prune(ctx, opts)
	}
	res := retention.Result{DryRun: opts.DryRun}
	window, err := s.inbox.PruneWindow(ctx, opts.Window)
	if err != nil {
		return res, fmt.Errorf("pruning inbox: %w", err)
	}
	now, err := s.inbox.Now(ctx)
	if err != nil {
		return res, fmt.Errorf("pruning inbox: %w", err)
	}
	res.Cutoff = now.Add(-window)
	res.Partitions, err = s.dropPartitions(ctx, res.Cutoff, opts.DryRun, opts.Summaries)
	return res, err
}

// Stats reads the inbox's size and the age of its oldest marker (by
// keep_until; by partition time on the partitioned layout) for the stored
// window, and reports that age to the hooks. It scans the table once: meant
// for an operator or a periodic job, not for every message.
func (s *Store) Stats(ctx context.Context) (retention.Stats, error) {
	st, err := s.inbox.Stats(ctx)
	if err != nil {
		return st, err
	}
	if s.layout == Partitioned {
		if st.Partitions, err = s.Partitions(ctx); err != nil {
			return st, err
		}
	}
	return st, nil
}
