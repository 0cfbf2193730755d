package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/idem/retention"
)

// Prune forgets the markers older than opts.Window (the store's window when
// zero; a shorter one is refused),
// in batches of opts.BatchSize, each its own short transaction. A marker
// goes when both its event time (if any) and its write time are past the
// window; package retention explains why that never lets a duplicate
// through a consumer whose idem.Horizon.Window is the same.
//
// On PostgreSQL one instance prunes a table at a time: the others find the
// advisory lock taken (the same lock as pgxinbox's) and return at once with
// Result.Skipped. On SQLite, writers already take turns on the database
// lock; the cut-off is the local clock, which wrote processed_at.
func (s *Store) Prune(ctx context.Context, opts retention.Options) (retention.Result, error) {
	opts = opts.WithDefaults(s.window)
	if err := opts.Validate(); err != nil {
		return retention.Result{}, fmt.Errorf("pruning inbox: %w", err)
	}
	if opts.Window < s.window {
		return retention.Result{}, fmt.Errorf("pruning inbox: window %v is shorter than the store's window %v, which consumers' horizon guards accept", opts.Window, s.window)
	}
	res := retention.Result{DryRun: opts.DryRun}
	table := s.table.quoted()
	var q execQuerier = s.db
	batchSQL, countSQL := retention.SQLitePruneBatch(table), retention.SQLitePrunable(table)
	now := time.Now()
	if s.dialect == Postgres {
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return res, fmt.Errorf("pruning inbox: %w", err)
		}
		defer conn.Close()
		var leader bool
		if err := conn.QueryRowContext(ctx, retention.PostgresTryLock, table).Scan(&leader); err != nil {
			return res, fmt.Errorf("taking the prune lock: %w", err)
		}
		if !leader {
			res.Skipped = true
			return res, nil
		}
		defer func() {
			if _, err := conn.ExecContext(context.WithoutCancel(ctx), retention.PostgresUnlock, table); err != nil {
				// Never hand a connection that may still hold the lock back
				// to the pool.
				_ = conn.Raw(func(any) error { return errBadConn })
			}
		}()
		if err := conn.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
			return res, fmt.Errorf("reading the database clock: %w", err)
		}
		q = conn
		batchSQL, countSQL = retention.PostgresPruneBatch(table), retention.PostgresPrunable(table)
	}
	res.Cutoff = now.Add(-opts.Window)
	cutoff := s.dialect.timeArg(res.Cutoff)
	if opts.DryRun {
		if err := q.QueryRowContext(ctx, countSQL, cutoff).Scan(&res.Markers); err != nil {
			return res, fmt.Errorf("counting prunable markers: %w", err)
		}
		return res, nil
	}
	hooks := retention.Or(opts.Hooks, nil)
	defer func() { hooks.MarkersPruned(s.table.String(), res.Markers) }()
	for {
		r, err := q.ExecContext(ctx, batchSQL, cutoff, opts.BatchSize)
		if err != nil {
			return res, fmt.Errorf("deleting a batch of markers: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return res, fmt.Errorf("deleting a batch of markers: %w", err)
		}
		res.Batches++
		res.Markers += n
		if n < int64(opts.BatchSize) {
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("pruning inbox: %w", err)
		}
	}
}

// execQuerier is a *sql.DB or a *sql.Conn.
type execQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Stats reads the inbox's size and the age of its oldest marker for a
// retention window (14 days when zero), and reports that age to hooks (which
// may be nil). It scans the table once.
func (s *Store) Stats(ctx context.Context, window time.Duration, hooks retention.Hooks) (retention.Stats, error) {
	if window == 0 {
		window = retention.DefaultWindow
	}
	st := retention.Stats{Table: s.table.String(), Window: window, Now: time.Now()}
	table := s.table.quoted()
	var oldest any
	var err error
	if s.dialect == Postgres {
		err = s.db.QueryRowContext(ctx, `SELECT now()`).Scan(&st.Now)
		if err == nil {
			err = s.db.QueryRowContext(ctx, retention.PostgresStats(table), st.Now.Add(-window)).
				Scan(&st.Rows, &st.NoEventTime, &oldest, &st.Prunable, &st.Now)
		}
	} else {
		err = s.db.QueryRowContext(ctx, retention.SQLiteStats(table), s.dialect.timeArg(st.Now.Add(-window))).
			Scan(&st.Rows, &st.NoEventTime, &oldest, &st.Prunable)
	}
	if err != nil {
		return st, fmt.Errorf("reading inbox stats: %w", err)
	}
	if st.Oldest, err = s.dialect.scanTime(oldest); err != nil {
		return st, fmt.Errorf("reading inbox stats: %w", err)
	}
	st.Finish()
	if st.Rows > 0 {
		retention.Or(hooks, nil).OldestMarker(s.table.String(), st.OldestAge)
	}
	return st, nil
}
