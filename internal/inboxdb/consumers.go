package inboxdb

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
)

// ConsumerStats is the per-consumer view of an inbox: for each consumer
// with markers, how many it has and how old its oldest one is against the
// stored window. It is what a metrics scrape reads (package idemprom's
// InboxCollector), so it is built to be cheap on a large table: no scan of
// the table's rows, only of its indexes (see [Inbox.ConsumerStats]).
type ConsumerStats struct {
	// Table is the inbox's name as written, the label of its metrics.
	Table string
	// Window is the retention window stored with the table.
	Window time.Duration
	// Now is the database's clock when the figures were read.
	Now time.Time
	// Consumers has one entry per consumer with at least one marker, in
	// byte order of the consumer's name.
	Consumers []ConsumerStat
}

// ConsumerStat is one consumer's markers in an inbox.
type ConsumerStat struct {
	Consumer string
	// Markers is the number of markers the consumer holds.
	Markers int64
	// Oldest is the retention time of the consumer's oldest marker: its
	// keep_until (the later of its write time and the event times of the
	// messages that met it), or its partition time on the partitioned
	// layout, where whole days are dropped by it.
	Oldest time.Time
	// OldestAge is Now minus Oldest.
	OldestAge time.Duration
	// Headroom is Window minus OldestAge: how long until the consumer's
	// oldest marker may be pruned. Negative: markers past the window are
	// waiting for a prune that is not running (or is late by that much).
	Headroom time.Duration
}

// consumerSQL is the dialect's pair of statements for ConsumerStats: the
// consumers of the inbox, and one consumer's count and oldest retention
// time. They live here rather than in the dialect files because only this
// read uses them.
type consumerSQL struct {
	list, one string
}

// consumerStatements builds the statements for d.
//
// The consumers are listed by a loose index scan of the primary key
// (consumer, key): each step is one probe for the next consumer name, so
// the cost is the number of consumers, not of markers. Then, per consumer:
//
//   - the count is an index-only scan of the consumer's range of the primary
//     key (the visibility map permitting: a vacuumed table reads no heap);
//   - the oldest keep_until comes from the keep_until index, read in order
//     until the consumer's first entry, or from the primary-key range,
//     whichever the planner finds cheaper for that consumer; on the
//     partitioned layout the partition time is part of the primary key,
//     so count and oldest are one index-only scan.
//
// One statement per consumer, bound to its name, keeps each plan sized to
// that consumer (one statement over all consumers is planned for an
// average one, and may walk the whole keep_until index for a small one).
func consumerStatements(d *Dialect) consumerSQL {
	q := d.Table.Quoted()
	p := "$1"
	if d.Name == "sqlite" {
		p = "?1"
	}
	s := consumerSQL{list: `WITH RECURSIVE c(consumer) AS (
    SELECT min(consumer) FROM ` + q + `
    UNION ALL
    SELECT (SELECT min(i.consumer) FROM ` + q + ` i WHERE i.consumer > c.consumer)
    FROM c WHERE c.consumer IS NOT NULL)
SELECT consumer FROM c WHERE consumer IS NOT NULL`}
	if d.Layout == idem.LayoutPartitioned {
		s.one = `SELECT count(*), min(partition_time) FROM ` + q + ` WHERE consumer = ` + p
	} else {
		s.one = `SELECT (SELECT count(*) FROM ` + q + ` WHERE consumer = ` + p + `),
       (SELECT min(keep_until) FROM ` + q + ` WHERE consumer = ` + p + `)`
	}
	return s
}

// ConsumerStats reads, for every consumer of the inbox, its number of
// markers and the age of its oldest one against the stored window. Unlike
// [Inbox.Stats] it does not scan the table: see [ConsumerStats] for what
// it reads. ctx bounds the whole read; a caller on a schedule (a metrics
// scrape) should give it a deadline.
func (b *Inbox) ConsumerStats(ctx context.Context) (ConsumerStats, error) {
	out := ConsumerStats{Table: b.Label()}
	set, err := b.stored(ctx)
	if err != nil {
		return out, fmt.Errorf("reading per-consumer inbox stats: %w", err)
	}
	out.Window = set.Window
	sql := consumerStatements(b.D)
	err = b.read(ctx, func(c Conn) error {
		var err error
		if out.Now, err = b.now(ctx, c); err != nil {
			return err
		}
		var names []string
		err = c.Query(ctx, sql.list, func(r Row) error {
			var name string
			if err := r.Scan(&name); err != nil {
				return err
			}
			names = append(names, name)
			return nil
		})
		if err != nil {
			return fmt.Errorf("listing consumers: %w", err)
		}
		out.Consumers = make([]ConsumerStat, 0, len(names))
		for _, name := range names {
			st := ConsumerStat{Consumer: name}
			var oldest any
			if err := c.QueryRow(ctx, sql.one, name).Scan(&st.Markers, &oldest); err != nil {
				return fmt.Errorf("reading the markers of consumer %s: %w", name, err)
			}
			if st.Oldest, err = b.D.ScanTime(oldest); err != nil {
				return err
			}
			if st.Markers == 0 {
				// Pruned between the listing and the count.
				continue
			}
			st.OldestAge = out.Now.Sub(st.Oldest)
			st.Headroom = out.Window - st.OldestAge
			out.Consumers = append(out.Consumers, st)
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("reading per-consumer inbox stats of %s: %w", b.D.Table, err)
	}
	return out, nil
}
