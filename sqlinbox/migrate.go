package sqlinbox

import (
	"context"
	"fmt"
)

// Migrate creates or upgrades the inbox table to the latest schema version
// and records its settings (layout and window) beside it. All pending
// migrations apply in one transaction, so a failure leaves the previous
// version intact. Concurrent migrators are serialized (an advisory lock on
// PostgreSQL, BEGIN IMMEDIATE on SQLite); running Migrate again is a no-op.
// On PostgreSQL the table, the migrations and the bookkeeping are those of
// package pgxinbox's plain layout (package internal/inboxdb writes both).
//
// A table's stored window is written once, from Config.Window (14 days by
// default); a different non-zero Config.Window on an existing table is
// refused with both numbers (change the stored one with [Store.SetWindow]).
func (s *Store) Migrate(ctx context.Context) error {
	set, err := s.inbox.Migrate(ctx)
	if err != nil {
		return fmt.Errorf("sqlinbox: %w", err)
	}
	s.window.Store(int64(set.Window))
	return nil
}
