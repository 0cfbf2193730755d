package sqlinbox

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/idemstore"
)

// Migrate creates or upgrades the inbox table to the latest schema version
// and records its settings (layout and window) beside it. All pending
// migrations apply in one transaction, so a failure leaves the previous
// version intact (on PostgreSQL and SQLite; MySQL's DDL commits implicitly,
// so each of its migrations is idempotent instead). Concurrent migrators are
// serialized (an advisory lock on PostgreSQL, BEGIN IMMEDIATE on SQLite, a
// named lock held by the migrating session on MySQL and MariaDB); running
// Migrate again is a no-op.
// On PostgreSQL the table, the migrations and the bookkeeping are those of
// package pgxinbox's plain layout (package internal/inboxdb writes both).
//
// A table's stored window is written once, from Config.Window (14 days by
// default); a different non-zero Config.Window on an existing table is
// refused with both numbers (change the stored one with [Store.SetWindow]).
//
// [Store.MigrateReport] does the same and says what it did.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.MigrateReport(ctx)
	return err
}

// MigrateReport is [Store.Migrate], reporting whether it created the
// table, upgraded it (the schema versions before and after) or found it up
// to date, with its stored layout and window.
func (s *Store) MigrateReport(ctx context.Context) (idemstore.MigrateReport, error) {
	set, rep, err := s.inbox.MigrateReport(ctx)
	if err != nil {
		return rep, fmt.Errorf("sqlinbox: %w", err)
	}
	s.window.Store(int64(set.Window))
	return rep, nil
}
