package pgxinbox

import (
	"context"

	"github.com/idemkit/idem/internal/inboxdb"
)

// ConsumerStats is the per-consumer view of an inbox that
// [Store.ConsumerStats] returns: the stored window, the database's clock,
// and each consumer's markers.
type ConsumerStats = inboxdb.ConsumerStats

// ConsumerStat is one consumer's markers: how many, the retention time of
// the oldest, its age and the window's headroom over it.
type ConsumerStat = inboxdb.ConsumerStat

// ConsumerStats reads, for every consumer of the inbox, its number of
// markers and the age of its oldest one (by keep_until; by partition time
// on the partitioned layout) against the stored window. It reads indexes
// only, never the table's rows: a loose scan of the primary key lists the
// consumers, then per consumer an index-only count of its primary-key
// range and one probe of the keep_until index for its oldest marker. It is
// meant for a metrics scrape (idemprom.InboxCollector, which caches it and
// bounds it with a deadline); give ctx a deadline when calling it on a
// schedule of your own.
func (s *Store) ConsumerStats(ctx context.Context) (ConsumerStats, error) {
	return s.inbox.ConsumerStats(ctx)
}
