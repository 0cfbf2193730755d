package pgxinbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/retention"
)

// PruneOptions configure [Store.Prune]; see [retention.Options].
type PruneOptions = retention.Options

// Prune forgets the markers older than the window (see package retention
// for which markers, and why that never lets a duplicate through the horizon
// guard).
//
// On the plain layout it deletes them in batches of opts.BatchSize, each its
// own short transaction, so no lock is held long and claims keep flowing.
// Only one instance prunes a table at a time: the others find its advisory
// lock taken and return at once with Result.Skipped. The store's DB must be
// a *pgxpool.Pool or a *pgx.Conn (the lock lives on one connection).
//
// On the partitioned layout it drops the partitions older than the window
// ([Store.DropPartitions]): markers of a day that straddles the cut-off stay
// until the whole day is past it, up to a day longer than the window.
func (s *Store) Prune(ctx context.Context, opts PruneOptions) (retention.Result, error) {
	opts = opts.WithDefaults(s.window)
	if err := opts.Validate(); err != nil {
		return retention.Result{}, fmt.Errorf("pruning inbox: %w", err)
	}
	if opts.Window < s.window {
		return retention.Result{}, fmt.Errorf("pruning inbox: window %v is shorter than the store's window %v, which consumers' horizon guards accept", opts.Window, s.window)
	}
	hooks := retention.Or(opts.Hooks, s.hooks)
	res := retention.Result{DryRun: opts.DryRun}
	if s.layout == Partitioned {
		now, err := s.now(ctx)
		if err != nil {
			return res, fmt.Errorf("pruning inbox: %w", err)
		}
		res.Cutoff = now.Add(-opts.Window)
		res.Partitions, err = s.DropPartitions(ctx, res.Cutoff, opts.DryRun)
		return res, err
	}

	conn, release, err := s.conn(ctx)
	if err != nil {
		return res, fmt.Errorf("pruning inbox: %w", err)
	}
	defer release()
	var leader bool
	if err := conn.QueryRow(ctx, retention.PostgresTryLock, s.name).Scan(&leader); err != nil {
		return res, fmt.Errorf("taking the prune lock: %w", err)
	}
	if !leader {
		res.Skipped = true
		return res, nil
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), retention.PostgresUnlock, s.name); err != nil {
			// A connection still holding the lock must not go back to the
			// pool: other instances would never prune again.
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	var now time.Time
	if err := conn.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return res, fmt.Errorf("reading the database clock: %w", err)
	}
	res.Cutoff = now.Add(-opts.Window)
	if opts.DryRun {
		err := conn.QueryRow(ctx, retention.PostgresPrunable(s.name), res.Cutoff).Scan(&res.Markers)
		if err != nil {
			return res, fmt.Errorf("counting prunable markers: %w", err)
		}
		return res, nil
	}
	batch := retention.PostgresPruneBatch(s.name)
	defer func() { hooks.MarkersPruned(s.name, res.Markers) }()
	for {
		// Outside a transaction block each DELETE commits on its own: the
		// row locks of one batch last one statement.
		tag, err := conn.Exec(ctx, batch, res.Cutoff, opts.BatchSize)
		if err != nil {
			return res, fmt.Errorf("deleting a batch of markers: %w", err)
		}
		res.Batches++
		res.Markers += tag.RowsAffected()
		if tag.RowsAffected() < int64(opts.BatchSize) {
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("pruning inbox: %w", err)
		}
	}
}

// conn returns one connection of the store's DB and a function that gives it
// back: the prune lock is a session lock.
func (s *Store) conn(ctx context.Context) (*pgx.Conn, func(), error) {
	switch db := s.db.(type) {
	case *pgxpool.Pool:
		c, err := db.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return c.Conn(), c.Release, nil
	case *pgx.Conn:
		return db, func() {}, nil
	}
	return nil, nil, errors.New("the store's DB must be a *pgxpool.Pool or a *pgx.Conn to prune")
}

// Stats reads the inbox's size and the age of its oldest marker, and reports
// that age to the hooks. It scans the table once: meant for an operator or a
// periodic job, not for every message.
func (s *Store) Stats(ctx context.Context) (retention.Stats, error) {
	st := retention.Stats{Table: s.name, Window: s.window}
	err := s.read(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&st.Now); err != nil {
			return err
		}
		cutoff := st.Now.Add(-s.window)
		var oldest *time.Time
		if err := tx.QueryRow(ctx, retention.PostgresStats(s.name), cutoff).Scan(&st.Rows, &st.NoEventTime, &oldest, &st.Prunable, &st.Now); err != nil {
			return err
		}
		if oldest != nil {
			st.Oldest = *oldest
		}
		if s.layout == Partitioned {
			// Partitions go whole: what the next drop removes is what lies
			// before the first day that ends after the cut-off.
			bound := cutoff.UTC().Truncate(day)
			return tx.QueryRow(ctx, `SELECT count(*) FROM `+s.name+` WHERE event_time < $1`, bound).Scan(&st.Prunable)
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("reading inbox stats: %w", err)
	}
	if s.layout == Partitioned {
		if st.Partitions, err = s.Partitions(ctx); err != nil {
			return st, err
		}
	}
	st.Finish()
	if st.Rows > 0 {
		s.hooks.OldestMarker(s.name, st.OldestAge)
	}
	return st, nil
}
