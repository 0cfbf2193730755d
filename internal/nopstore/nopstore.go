// Package nopstore is an [idemstore.Store] without a database, for tests of
// code that builds a processor but does not test the inbox: every method
// succeeds and writes nothing. A test that needs one method to behave
// embeds [Store] and overrides it.
package nopstore

import (
	"context"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// Store does nothing and reports nothing: every claim inserts, no marker
// exists, no settings are stored, the database always answers.
type Store[TTx any] struct{}

var _ idemstore.Store[struct{}] = Store[struct{}]{}

// Begin returns the zero transaction.
func (Store[TTx]) Begin(context.Context) (TTx, error) {
	var tx TTx
	return tx, nil
}

// Commit succeeds.
func (Store[TTx]) Commit(context.Context, TTx) error { return nil }

// Rollback succeeds.
func (Store[TTx]) Rollback(context.Context, TTx) error { return nil }

// Claim reports every claim inserted.
func (Store[TTx]) Claim(_ context.Context, _ TTx, _ string, claims []idemstore.Claim, _ time.Duration) ([]bool, error) {
	inserted := make([]bool, len(claims))
	for i := range inserted {
		inserted[i] = true
	}
	return inserted, nil
}

// Lookup finds no marker.
func (Store[TTx]) Lookup(context.Context, TTx, string, []string) (map[string]idemstore.Marker, error) {
	return nil, nil
}

// Extend succeeds.
func (Store[TTx]) Extend(context.Context, TTx, string, []idemstore.Extension) error { return nil }

// Classify calls every error transient.
func (Store[TTx]) Classify(error) idemstore.ErrorClass { return idemstore.ClassTransient }

// Layout is the plain layout.
func (Store[TTx]) Layout() idemstore.Layout { return idemstore.LayoutPlain }

// Window is 0: the store has no retention window.
func (Store[TTx]) Window() time.Duration { return 0 }

// Settings are none.
func (Store[TTx]) Settings(context.Context) (idemstore.Settings, error) {
	return idemstore.Settings{}, nil
}

// SettingsIn are none.
func (Store[TTx]) SettingsIn(context.Context, TTx) (idemstore.Settings, error) {
	return idemstore.Settings{}, nil
}

// RecordHorizon succeeds.
func (Store[TTx]) RecordHorizon(context.Context, string, time.Duration) error { return nil }

// PrunedSummaries are none.
func (Store[TTx]) PrunedSummaries(context.Context, string) ([]idemstore.PrunedSummary, error) {
	return nil, nil
}

// PrunedSummariesIn are none.
func (Store[TTx]) PrunedSummariesIn(context.Context, TTx, string) ([]idemstore.PrunedSummary, error) {
	return nil, nil
}

// NeedsCommit is false.
func (Store[TTx]) NeedsCommit(TTx) bool { return false }

// Ping succeeds.
func (Store[TTx]) Ping(context.Context) error { return nil }

// Broken is false.
func (Store[TTx]) Broken(TTx) bool { return false }

// Check finds no problem.
func (Store[TTx]) Check(context.Context) ([]idemstore.SchemaProblem, error) { return nil, nil }

// Durability reports no setting and no risk.
func (Store[TTx]) Durability(context.Context) (idemstore.Durability, error) {
	return idemstore.Durability{}, nil
}

// Paused reports no pause.
func (Store[TTx]) Paused(context.Context, string) (idemstore.Pause, error) {
	return idemstore.Pause{}, nil
}

// PausedIn reports no pause.
func (Store[TTx]) PausedIn(context.Context, TTx, string) (idemstore.Pause, error) {
	return idemstore.Pause{}, nil
}

// RecordPositions records nothing.
func (Store[TTx]) RecordPositions(context.Context, TTx, string, []idemstore.Position) error {
	return nil
}

// Positions reports none.
func (Store[TTx]) Positions(context.Context, string) ([]idemstore.Position, error) { return nil, nil }

// ForgetPositions deletes nothing.
func (Store[TTx]) ForgetPositions(context.Context, string) (int64, error) { return 0, nil }
