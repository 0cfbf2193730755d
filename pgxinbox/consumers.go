package pgxinbox

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/internal/inboxdb"
)

// ConsumerStats is the per-consumer view of an inbox that
// [Store.ConsumerStats] returns: the stored window, the database's clock,
// and each consumer's oldest marker.
type ConsumerStats = inboxdb.ConsumerStats

// ConsumerStat is one consumer's oldest marker: its retention time, its
// age and the window's headroom over it.
type ConsumerStat = inboxdb.ConsumerStat

// ConsumerStats reads, for every consumer of the inbox, the age of its
// oldest marker (by keep_until; by partition time
// on the partitioned layout) against the stored window, and the headroom
// the window has left over it. It never passes over the table: a loose
// scan of the primary key lists the consumers, and the head of the
// keep_until index gives the oldest marker of every consumer whose oldest
// is among the table's oldest (a consumer with only recent markers reads
// its own primary-key range for it). It is meant for a metrics scrape
// (idemprom.InboxCollector, which caches it and bounds it with a
// deadline); give ctx a deadline when calling it on a schedule of your own.
//
// On the partitioned layout, which has no index by partition time, the
// oldest partition that holds markers is read once (one day of markers),
// which gives the oldest marker of every consumer in it; a consumer not in
// it is looked up in the following partitions, oldest first, in its own
// range of each partition's primary key.
func (s *Store) ConsumerStats(ctx context.Context) (ConsumerStats, error) {
	if s.layout != Partitioned {
		return s.inbox.ConsumerStats(ctx)
	}
	parts, err := s.partitions(ctx)
	if err != nil {
		return ConsumerStats{Table: s.inbox.Label()}, fmt.Errorf("reading per-consumer inbox stats: listing partitions: %w", err)
	}
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = s.qualified(p.name)
	}
	return s.inbox.ConsumerStatsPartitioned(ctx, names)
}

// ConsumerMarkers counts every consumer's markers. Unlike ConsumerStats it
// is one pass over the table (or its primary key): run it every few
// minutes at most (idemprom.InboxCollector does, in the background).
func (s *Store) ConsumerMarkers(ctx context.Context) (map[string]int64, error) {
	return s.inbox.ConsumerMarkers(ctx)
}
