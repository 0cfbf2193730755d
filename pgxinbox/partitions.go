package pgxinbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/retention"
)

const day = 24 * time.Hour

// DefaultDaysAhead is how many days of partitions past today [Store.Migrate]
// creates, and what `idem inbox partitions ensure` creates by default. Run
// the ensure at least daily; the slack lets a missed run or a producer clock
// running ahead go unnoticed.
const DefaultDaysAhead = 3

// ddlLockTimeout bounds how long partition DDL waits for its lock on the
// inbox. CREATE TABLE … PARTITION OF and DROP TABLE take an ACCESS EXCLUSIVE
// lock on the parent, and while they wait every new claim queues behind
// them: better to give up, retry a little later, and let claims through.
const ddlLockTimeout = 2 * time.Second

// ddlAttempts is how many times partition DDL tries before giving up.
const ddlAttempts = 5

// partitionSuffix is appended to the table's name, with the day, to name a
// daily partition: idem_inbox_p20260918.
const partitionSuffix = "_p20060102"

// partition is one daily partition: it holds partition times in [day, day+24h).
type partition struct {
	name string // unqualified
	day  time.Time
}

// partitionName is the unqualified name of the partition holding d's day,
// with the table's name cut so the whole stays within PostgreSQL's 63 bytes.
func (s *Store) partitionName(d time.Time) string {
	return s.partitionBase() + d.UTC().Format(partitionSuffix)
}

func (s *Store) partitionBase() string {
	base := s.table[len(s.table)-1]
	if limit := 63 - len(partitionSuffix); len(base) > limit {
		base = base[:limit]
	}
	return base
}

// qualified quotes a partition's name in the table's schema.
func (s *Store) qualified(name string) string {
	if len(s.table) == 2 {
		return pgx.Identifier{s.table[0], name}.Sanitize()
	}
	return pgx.Identifier{name}.Sanitize()
}

func (s *Store) needPartitioned(op string) error {
	if s.layout != Partitioned {
		return fmt.Errorf("%s: table %s has the %s layout; partitions need Layout: pgxinbox.Partitioned", op, s.name, s.layout)
	}
	return nil
}

// EnsurePartitions creates the daily partitions (UTC days) covering from's
// day and the days-1 days after it, skipping those that exist, and returns
// the names it created. It is idempotent and safe to run from several
// instances at once (they take turns on an advisory lock). Run it daily with
// from = now and days >= 2 (the CLI's default is [DefaultDaysAhead]+1), so a
// claim never finds its day missing.
func (s *Store) EnsurePartitions(ctx context.Context, from time.Time, days int) ([]string, error) {
	if err := s.needPartitioned("ensuring partitions"); err != nil {
		return nil, err
	}
	if days < 1 {
		return nil, fmt.Errorf("ensuring partitions: days %d must be at least 1", days)
	}
	first := from.UTC().Truncate(day)
	var created []string
	for i := range days {
		lo := first.Add(time.Duration(i) * day)
		name := s.partitionName(lo)
		const layout = "2006-01-02 15:04:05Z07:00"
		// DDL takes no bind parameters; the bounds are formatted from
		// time.Time values and the name is validated, so nothing here comes
		// from user text unchecked.
		ddl := fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
			s.qualified(name), s.name, lo.Format(layout), lo.Add(day).Format(layout))
		made := false
		err := s.ddl(ctx, func(tx pgx.Tx) error {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.qualified(name)).Scan(&exists); err != nil {
				return err
			}
			if exists {
				return nil
			}
			if _, err := tx.Exec(ctx, ddl); err != nil {
				return err
			}
			made = true
			return nil
		})
		if err != nil {
			return created, fmt.Errorf("creating partition %s: %w", name, err)
		}
		if made {
			created = append(created, name)
		}
	}
	return created, nil
}

// DropPartitions drops the daily partitions whose every partition time is
// older than olderThan (their day ends at or before it) and returns their
// names; with dryRun it only names them. It refuses a cut-off later than now
// minus the window stored with the table: those partitions may hold markers
// of messages the horizon guard still accepts. A dropped partition removes
// its markers at the cost of a file unlink: no WAL per row, no dead tuples,
// no vacuum.
func (s *Store) DropPartitions(ctx context.Context, olderThan time.Time, dryRun bool) ([]string, error) {
	return s.dropPartitions(ctx, olderThan, dryRun, retention.SummaryOptions{})
}

// dropPartitions is DropPartitions, summarising each partition's keys
// (retention.SummaryOptions) in the transaction that drops it.
func (s *Store) dropPartitions(ctx context.Context, olderThan time.Time, dryRun bool, sums retention.SummaryOptions) ([]string, error) {
	sums = sums.WithDefaults()
	if err := s.needPartitioned("dropping partitions"); err != nil {
		return nil, err
	}
	window, err := s.inbox.PruneWindow(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("dropping partitions: %w", err)
	}
	now, err := s.inbox.Now(ctx)
	if err != nil {
		return nil, fmt.Errorf("dropping partitions: %w", err)
	}
	if limit := now.Add(-window); olderThan.After(limit) {
		return nil, fmt.Errorf("dropping partitions: %w: cut-off %s is inside the window stored with table %s, %v (before the database's now: %s): messages that old are still accepted",
			retention.ErrShortWindow, olderThan.UTC().Format(time.RFC3339), s.inbox.Label(), window, limit.UTC().Format(time.RFC3339))
	}
	parts, err := s.partitions(ctx)
	if err != nil {
		return nil, fmt.Errorf("dropping partitions: %w", err)
	}
	var dropped []string
	for _, p := range parts {
		if p.day.Add(day).After(olderThan) {
			break // sorted by day: the rest are newer
		}
		if !dryRun {
			gone := false
			err := s.ddl(ctx, func(tx pgx.Tx) error {
				// Another instance may have dropped it since the listing:
				// count only what this one drops.
				var exists bool
				if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.qualified(p.name)).Scan(&exists); err != nil || !exists {
					return err
				}
				// The day's keys are summarised first, in this
				// transaction: a drop that could not summarise them does
				// not happen.
				if err := s.inbox.RecordDropped(ctx, inboxdb.PgxTxConn(tx), s.qualified(p.name), now, sums); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `DROP TABLE `+s.qualified(p.name))
				gone = err == nil
				return err
			})
			if err != nil {
				s.dropped(len(dropped))
				return dropped, fmt.Errorf("dropping partition %s: %w", p.name, err)
			}
			if !gone {
				continue
			}
		}
		dropped = append(dropped, p.name)
	}
	if !dryRun {
		s.dropped(len(dropped))
	}
	return dropped, nil
}

// dropped reports n partitions dropped to the hooks.
func (s *Store) dropped(n int) {
	idem.Each(s.hooks, func(h retention.DropHook) { h.OnDrop(s.inbox.Label(), n) })
}

// Partitions returns the names of the inbox's daily partitions, oldest first.
func (s *Store) Partitions(ctx context.Context) ([]string, error) {
	parts, err := s.partitions(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing partitions: %w", err)
	}
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = p.name
	}
	return names, nil
}

// partitions lists the daily partitions attached to the inbox, by day. It
// recognizes them by name: the bounds are then known without parsing
// pg_get_expr output, whose time format follows the session's settings.
// Partitions named otherwise (a user's own) are left alone.
func (s *Store) partitions(ctx context.Context) ([]partition, error) {
	var names []string
	err := s.read(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, s.name)
		if err != nil {
			return err
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, err
	}
	prefix := s.partitionBase()
	var out []partition
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, prefix)
		if !ok {
			continue
		}
		d, err := time.Parse(partitionSuffix, rest)
		if err != nil {
			continue
		}
		out = append(out, partition{name: n, day: d})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].day.Before(out[j].day) })
	return out, nil
}

// ddl runs one DDL step in its own short transaction, serialized with other
// instances' partition maintenance by an advisory lock, under a lock
// timeout, retrying a few times when the lock on the inbox is not granted in
// time (claims keep flowing meanwhile).
func (s *Store) ddl(ctx context.Context, step func(pgx.Tx) error) error {
	var err error
	for attempt := 1; attempt <= ddlAttempts; attempt++ {
		err = s.ddlOnce(ctx, step)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
	return fmt.Errorf("lock on the inbox not granted within %v, %d times: %w", ddlLockTimeout, ddlAttempts, err)
}

func (s *Store) ddlOnce(ctx context.Context, step func(pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := inboxdb.Cleanup(ctx)
		defer cancel()
		_ = tx.Rollback(ctx)
	}()
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", ddlLockTimeout.Milliseconds())); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idem.partitions'), hashtext($1::regclass::oid::text))`, s.name); err != nil {
		return err
	}
	if err := step(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// read runs f in a transaction that is rolled back: the store's DB offers
// transactions, not bare queries.
func (s *Store) read(ctx context.Context, f func(pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := inboxdb.Cleanup(ctx)
		defer cancel()
		_ = tx.Rollback(ctx)
	}()
	return f(tx)
}

// missingPartition reports PostgreSQL's "no partition of relation found for row":
// a check violation (23514) without a constraint name, which a CHECK
// constraint always has.
func missingPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.ConstraintName == ""
}
