package pgxinbox

import (
	"context"
	"fmt"
)

// Migrate brings the inbox table up to the newest schema version and
// records its settings beside it. It is safe to call on every start and
// from several processes at once: migrators queue on an advisory lock, and
// each version is applied once, recorded in idem_migrations next to the
// inbox table. It refuses a table that exists in the other layout.
//
// The layout and window are stored in idem_inbox_settings when the table
// has none (Config.Window, 14 days by default); an existing table keeps its
// stored window, and a different non-zero Config.Window is refused with both
// numbers (change the stored one with [Store.SetWindow]). From then on the
// store, its prune and every processor use the stored window.
//
// For the partitioned layout it then creates the daily partitions of the
// whole window and of the next days (see [Store.EnsurePartitions]), so the
// first claims find a partition.
func (s *Store) Migrate(ctx context.Context) error {
	set, err := s.inbox.Migrate(ctx)
	if err != nil {
		return fmt.Errorf("pgxinbox: %w", err)
	}
	s.window.Store(int64(set.Window))
	if s.layout != Partitioned {
		return nil
	}
	now, err := s.inbox.Now(ctx)
	if err != nil {
		return fmt.Errorf("migrating inbox: %w", err)
	}
	days := int(set.Window/day) + 1 + DefaultDaysAhead
	if _, err := s.EnsurePartitions(ctx, now.Add(-set.Window), days); err != nil {
		return fmt.Errorf("migrating inbox: %w", err)
	}
	return nil
}
