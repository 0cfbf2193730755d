package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/inboxdb"
)

// DefaultRetention is how long Prune keeps sent rows by default.
const DefaultRetention = 7 * 24 * time.Hour

// DestinationStats are the figures of one destination's rows.
type DestinationStats struct {
	Destination string // "" is RabbitMQ's default exchange
	Unsent      int64  // committed, not yet confirmed by the broker (parked rows excluded)
	// OldestUnsent is when the oldest unsent row was enqueued; zero when
	// none is unsent.
	OldestUnsent time.Time
	Parked       int64 // refused by the broker MaxAttempts times, waiting for an operator
	Sent         int64 // confirmed, kept until Prune
}

// Stats are the outbox's figures, per destination and in total.
type Stats struct {
	Table        string
	Destinations []DestinationStats
	Unsent       int64
	OldestUnsent time.Time
	// OldestUnsentAge is how long the oldest unsent row has waited, by
	// the database's clock: the relay's lag.
	OldestUnsentAge time.Duration
	Parked, Sent    int64
}

// Stats counts the outbox's rows. It reads the whole table: for a
// dashboard every few seconds, not for every message.
func (c *core) stats(ctx context.Context) (Stats, error) {
	st := Stats{Table: c.table.String()}
	var now time.Time
	err := c.drv.Read(ctx, func(conn inboxdb.Conn) error {
		var dbNow any
		if err := conn.QueryRow(ctx, c.s.dbNow).Scan(&dbNow); err != nil {
			return err
		}
		var err error
		if now, err = c.s.scanTime(dbNow); err != nil {
			return err
		}
		return conn.Query(ctx, c.s.stats, func(row inboxdb.Row) error {
			var d DestinationStats
			var oldest any
			var unsent, parked, sent sql.NullInt64
			if err := row.Scan(&d.Destination, &unsent, &oldest, &parked, &sent); err != nil {
				return err
			}
			t, err := c.s.scanTime(oldest)
			if err != nil {
				return err
			}
			d.Unsent, d.OldestUnsent, d.Parked, d.Sent = unsent.Int64, t, parked.Int64, sent.Int64
			st.Destinations = append(st.Destinations, d)
			st.Unsent += d.Unsent
			st.Parked += d.Parked
			st.Sent += d.Sent
			if !t.IsZero() && (st.OldestUnsent.IsZero() || t.Before(st.OldestUnsent)) {
				st.OldestUnsent = t
			}
			return nil
		})
	})
	if err != nil {
		return st, c.wrap("reading the stats", err)
	}
	if !st.OldestUnsent.IsZero() {
		st.OldestUnsentAge = max(now.Sub(st.OldestUnsent), 0)
	}
	return st, nil
}

// PruneOptions bound a Prune.
type PruneOptions struct {
	// Retention is how long sent rows are kept after they were sent.
	// Defaults to DefaultRetention, 7 days.
	Retention time.Duration
	// BatchSize is how many rows one DELETE removes (each its own short
	// transaction). Defaults to 1000.
	BatchSize int
	// DryRun counts the rows Prune would delete without deleting them.
	DryRun bool
}

// Prune deletes the rows sent longer than the retention ago, in batches,
// and returns how many it deleted (or, with DryRun, would delete). Unsent
// and parked rows are never deleted.
func (c *core) prune(ctx context.Context, opts PruneOptions) (int64, error) {
	if opts.Retention == 0 {
		opts.Retention = DefaultRetention
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = 1000
	}
	if opts.Retention < 0 || opts.BatchSize < 0 {
		return 0, fmt.Errorf("pruning outbox %s: retention and batch size must be positive", c.table)
	}
	var cutoff time.Time
	err := c.drv.Read(ctx, func(conn inboxdb.Conn) error {
		var dbNow any
		if err := conn.QueryRow(ctx, c.s.dbNow).Scan(&dbNow); err != nil {
			return err
		}
		now, err := c.s.scanTime(dbNow)
		cutoff = now.Add(-opts.Retention)
		return err
	})
	if err != nil {
		return 0, c.wrap("pruning", err)
	}
	if opts.DryRun {
		var n int64
		err := c.drv.Read(ctx, func(conn inboxdb.Conn) error {
			return conn.QueryRow(ctx, c.s.prunable, c.s.timeArg(cutoff)).Scan(&n)
		})
		if err != nil {
			return 0, c.wrap("counting the prunable rows", err)
		}
		return n, nil
	}
	var total int64
	for {
		n, err := c.exec(ctx, c.s.prune, c.s.timeArg(cutoff), opts.BatchSize)
		total += n
		if err != nil {
			return total, c.wrap(fmt.Sprintf("pruning (after %d rows)", total), err)
		}
		if n < int64(opts.BatchSize) {
			return total, nil
		}
	}
}

// exec runs one statement in its own short transaction.
func (c *core) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tx, err := c.drv.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	n, err := tx.Exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return n, tx.Commit(ctx)
}

// RetryFilter selects parked rows for Retry; empty fields match any.
type RetryFilter struct {
	Destination string
	Key         string
	ID          string
}

// Retry un-parks the parked rows that match f: their attempts start again
// from zero and the relays send them on their next pass (on PostgreSQL
// they are notified). It returns how many rows it un-parked.
func (c *core) retry(ctx context.Context, f RetryFilter) (int64, error) {
	tx, err := c.drv.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("retrying parked rows of outbox %s: %w", c.table, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	n, err := tx.Exec(ctx, c.s.unpark, f.Destination, f.Key, f.ID)
	if err == nil && n > 0 && c.s.notify != "" {
		var ignored any
		err = tx.QueryRow(ctx, c.s.notify, c.channel).Scan(&ignored)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return 0, c.wrap("retrying the parked rows", err)
	}
	if n > 0 {
		c.wakeAll()
	}
	return n, nil
}

// ParkedRow is a row the relay parked.
type ParkedRow struct {
	Seq         int64
	ID          string
	Destination string
	Key         string
	Attempts    int
	ParkedAt    time.Time
	Reason      string
}

// ParkedRows lists up to limit parked rows, oldest first.
func (c *core) parkedRows(ctx context.Context, limit int) ([]ParkedRow, error) {
	var out []ParkedRow
	err := c.drv.Read(ctx, func(conn inboxdb.Conn) error {
		return conn.Query(ctx, c.s.parked, func(row inboxdb.Row) error {
			var p ParkedRow
			var at any
			var reason sql.NullString
			if err := row.Scan(&p.Seq, &p.ID, &p.Destination, &p.Key, &p.Attempts, &at, &reason); err != nil {
				return err
			}
			t, err := c.s.scanTime(at)
			p.ParkedAt, p.Reason = t, reason.String
			out = append(out, p)
			return err
		}, limit)
	})
	if err != nil {
		return nil, c.wrap("listing the parked rows", err)
	}
	return out, nil
}

// SentFilter selects sent rows for [Outbox.SentRows].
type SentFilter struct {
	// From and To bound the rows' event time: From <= event time < To.
	// A zero From means from the start; a zero To means up to now and
	// beyond.
	From, To time.Time
	// Destination keeps the rows of one topic or exchange; empty: all.
	Destination string
	// AfterSeq lists rows after this sequence number, to page through a
	// range: pass the last Seq of the previous page.
	AfterSeq int64
	// Limit bounds the rows returned; 0 means 1000.
	Limit int
}

// farFuture bounds a SentFilter without To.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// sentRows lists the rows the broker confirmed that f selects, in seq
// order, as the relay published them: for a reconciliation, which checks
// that each reached its consumer.
func (c *core) sentRows(ctx context.Context, f SentFilter) ([]Record, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	from, to := f.From, f.To
	if from.IsZero() {
		from = never
	}
	if to.IsZero() {
		to = farFuture
	}
	var out []Record
	err := c.drv.Read(ctx, func(conn inboxdb.Conn) error {
		return conn.Query(ctx, c.s.sent, func(rw inboxdb.Row) error {
			var r Record
			var headers sql.NullString
			var eventTime any
			var shard int
			if err := rw.Scan(&r.Seq, &r.ID, &r.Destination, &r.RoutingKey, &r.Key, &headers, &r.Body, &eventTime, &r.Attempts, &shard); err != nil {
				return err
			}
			t, err := c.s.scanTime(eventTime)
			if err != nil {
				return err
			}
			r.EventTime = t.UTC()
			if headers.Valid {
				if err := json.Unmarshal([]byte(headers.String), &r.Headers); err != nil {
					return fmt.Errorf("row %d: decoding headers: %w", r.Seq, err)
				}
			}
			out = append(out, r)
			return nil
		}, f.AfterSeq, c.s.timeArg(from.UTC()), c.s.timeArg(to.UTC()), f.Destination, f.Limit)
	})
	if err != nil {
		return nil, c.wrap("listing the sent rows", err)
	}
	return out, nil
}
