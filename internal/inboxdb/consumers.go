package inboxdb

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// ConsumerStats is the per-consumer view of an inbox: for each consumer
// with markers, how old its oldest one is against the stored window. It is
// what a metrics scrape reads (package idemprom's InboxCollector), so it is
// read from the heads of indexes, never by a pass over the table (see
// [Inbox.ConsumerStats]). The number of markers, which does take a pass,
// is [Inbox.ConsumerMarkers].
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

// ConsumerStat is one consumer's oldest marker in an inbox.
type ConsumerStat struct {
	Consumer string
	// Oldest is the retention time of the consumer's oldest marker: its
	// keep_until (the later of its write time and the event times of the
	// messages that met it), or its partition time on the partitioned
	// layout, where whole days are dropped by it.
	Oldest time.Time
	// OldestAge is Now minus Oldest.
	OldestAge time.Duration
	// Headroom is Window minus OldestAge: how long until the consumer's
	// oldest marker may be pruned. A table the prune keeps trim sits near
	// zero (a little below it between two prunes); well below zero,
	// markers past the window are waiting for a prune that is not running.
	Headroom time.Duration
}

// oldestProbe is how many of the table's oldest markers the oldest
// statement reads: every consumer whose oldest marker is among them gets
// it from there.
const oldestProbe = 10000

// consumerSQL is the dialect's statements for ConsumerStats and
// ConsumerMarkers. They live here rather than in the dialect files because
// only these reads use them.
type consumerSQL struct {
	// list: the consumers of the inbox.
	list string
	// oldest ($1 limit): the oldest retention time of every consumer among
	// the table's $1 oldest markers.
	oldest string
	// one ($1 consumer): the consumer's oldest retention time, from its own
	// rows.
	one string
	// count: every consumer's number of markers.
	count string
}

// consumerStatements builds the statements for d.
//
// The consumers are listed by a loose index scan of the primary key
// (consumer, key): each step is one probe for the next consumer name, so
// the cost is the number of consumers, not of markers. The oldest marker
// of most consumers comes from the head of the keep_until index (on the
// partitioned layout, of the oldest partition): a live consumer's oldest
// markers are near the window's edge, among the table's oldest. Only a
// consumer whose oldest marker is newer than the table's first oldestProbe
// markers (one that started recently, or has few markers) reads its own
// primary-key range for it, as cheap as that consumer is small. A min() of
// keep_until bound to the consumer is not used for that: the planner
// answers it by walking the keep_until index from the start, past every
// older marker of every other consumer (OFFSET 0 keeps it from doing so).
func consumerStatements(d *Dialect) consumerSQL {
	q := d.Table.Quoted()
	p, fence := "$1", "OFFSET 0"
	switch d.Name {
	case "sqlite":
		p, fence = "?1", "LIMIT -1 OFFSET 0"
	case "mysql":
		p, fence = "?", ""
	}
	col := "keep_until"
	if d.Layout == idemstore.LayoutPartitioned {
		col = "partition_time"
	}
	return consumerSQL{
		list: `WITH RECURSIVE c(consumer) AS (
    SELECT min(consumer) FROM ` + q + `
    UNION ALL
    SELECT (SELECT min(i.consumer) FROM ` + q + ` i WHERE i.consumer > c.consumer)
    FROM c WHERE c.consumer IS NOT NULL)
SELECT consumer FROM c WHERE consumer IS NOT NULL`,
		oldest: `SELECT consumer, min(t) FROM (
    SELECT consumer, ` + col + ` AS t FROM ` + q + ` ORDER BY ` + col + ` LIMIT ` + p + `) o
GROUP BY consumer`,
		one:   `SELECT min(t) FROM (SELECT ` + col + ` AS t FROM ` + q + ` WHERE consumer = ` + p + ` ` + fence + `) o`,
		count: `SELECT consumer, count(*) FROM ` + q + ` GROUP BY consumer`,
	}
}

// ConsumerStats reads, for every consumer of the inbox, the age of its
// oldest marker against the stored window. Unlike [Inbox.Stats] it does
// not pass over the table: the consumers come from the primary key, the
// oldest markers from the head of the keep_until index (see
// [consumerStatements]). ctx bounds the whole read; a caller on a schedule
// (a metrics scrape) should give it a deadline.
func (b *Inbox) ConsumerStats(ctx context.Context) (ConsumerStats, error) {
	return b.consumerStats(ctx, nil)
}

// ConsumerStatsPartitioned is ConsumerStats on the partitioned layout,
// given the table's daily partitions, quoted, oldest first. There is no
// index by partition time (the partitions are the order): the oldest
// partition that holds markers is read once, which gives the oldest
// marker of every consumer in it, and a consumer not in it is looked up
// in the following partitions, in its own primary-key range.
func (b *Inbox) ConsumerStatsPartitioned(ctx context.Context, partitions []string) (ConsumerStats, error) {
	if partitions == nil {
		partitions = []string{}
	}
	return b.consumerStats(ctx, partitions)
}

// consumerStats reads ConsumerStats; partitions, when not nil, are the
// daily partitions of a partitioned inbox, oldest first.
func (b *Inbox) consumerStats(ctx context.Context, partitions []string) (ConsumerStats, error) {
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
		oldest := map[string]time.Time{}
		if partitions == nil {
			err = c.Query(ctx, sql.oldest, func(r Row) error {
				var name string
				var t any
				if err := r.Scan(&name, &t); err != nil {
					return err
				}
				at, err := b.D.ScanTime(t)
				oldest[name] = at
				return err
			}, oldestProbe)
		} else {
			err = b.oldestByPartition(ctx, c, partitions, names, oldest)
		}
		if err != nil {
			return fmt.Errorf("reading the oldest markers: %w", err)
		}
		out.Consumers = make([]ConsumerStat, 0, len(names))
		for _, name := range names {
			st := ConsumerStat{Consumer: name}
			at, ok := oldest[name]
			if !ok {
				var t any
				if err := c.QueryRow(ctx, sql.one, name).Scan(&t); err != nil {
					return fmt.Errorf("reading the oldest marker of consumer %s: %w", name, err)
				}
				if at, err = b.D.ScanTime(t); err != nil {
					return err
				}
				if at.IsZero() {
					continue // pruned since the listing
				}
			}
			st.Oldest = at
			st.OldestAge = out.Now.Sub(at)
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

// oldestByPartition fills oldest with the oldest partition time of each
// of names, looking in partitions oldest first. The oldest partition that
// holds markers is read once for every consumer in it (one day of the
// table); a consumer not in it is then looked up partition by partition in
// its own primary-key range, which for the partitions it has no marker in
// is one index probe each.
func (b *Inbox) oldestByPartition(ctx context.Context, c Conn, partitions, names []string, oldest map[string]time.Time) error {
	left := len(names)
	first := true
	for _, part := range partitions {
		if left == 0 {
			return nil
		}
		if first {
			err := c.Query(ctx, `SELECT consumer, min(partition_time) FROM `+part+` GROUP BY consumer`, func(r Row) error {
				var name string
				var t any
				if err := r.Scan(&name, &t); err != nil {
					return err
				}
				at, err := b.D.ScanTime(t)
				if _, dup := oldest[name]; !dup && err == nil {
					oldest[name] = at
					left--
					first = false
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("partition %s: %w", part, err)
			}
			continue
		}
		q := `SELECT min(partition_time) FROM ` + part + ` WHERE consumer = $1`
		for _, name := range names {
			if _, ok := oldest[name]; ok {
				continue
			}
			var t any
			if err := c.QueryRow(ctx, q, name).Scan(&t); err != nil {
				return fmt.Errorf("partition %s, consumer %s: %w", part, name, err)
			}
			at, err := b.D.ScanTime(t)
			if err != nil {
				return err
			}
			if !at.IsZero() {
				oldest[name] = at
				left--
			}
		}
	}
	return nil
}

// ConsumerMarkers counts every consumer's markers. It is one pass over
// the table (or over its primary key, where the visibility map lets the
// planner read the index alone): at about a quarter of a second per
// million markers, it is for a schedule measured in minutes, not for every
// scrape.
func (b *Inbox) ConsumerMarkers(ctx context.Context) (map[string]int64, error) {
	sql := consumerStatements(b.D)
	out := map[string]int64{}
	err := b.read(ctx, func(c Conn) error {
		return c.Query(ctx, sql.count, func(r Row) error {
			var name string
			var n int64
			if err := r.Scan(&name, &n); err != nil {
				return err
			}
			out[name] = n
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("counting the markers of %s by consumer: %w", b.D.Table, err)
	}
	return out, nil
}
