package pgxinbox

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/idemstore"
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
//
// [Store.MigrateReport] does the same and says what it did.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.MigrateReport(ctx)
	return err
}

// MigrateReport is [Store.Migrate], reporting whether it created the
// table, upgraded it (the schema versions before and after) or found it up
// to date, with its stored layout and window and the partitions it
// created.
func (s *Store) MigrateReport(ctx context.Context) (idemstore.MigrateReport, error) {
	set, rep, err := s.inbox.MigrateReport(ctx)
	if err != nil {
		return rep, fmt.Errorf("pgxinbox: %w", err)
	}
	s.window.Store(int64(set.Window))
	if s.layout != Partitioned {
		return rep, nil
	}
	now, err := s.inbox.Now(ctx)
	if err != nil {
		return rep, fmt.Errorf("migrating inbox: %w", err)
	}
	days := int(set.Window/day) + 1 + DefaultDaysAhead
	made, err := s.EnsurePartitions(ctx, now.Add(-set.Window), days)
	rep.Partitions = len(made)
	if err != nil {
		return rep, fmt.Errorf("migrating inbox: %w", err)
	}
	return rep, nil
}
