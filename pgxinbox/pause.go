package pgxinbox

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
)

var _ idemstore.Store[pgx.Tx] = (*Store)(nil)

// ConsumerPause is one paused consumer of the inbox.
type ConsumerPause = inboxdb.ConsumerPause

// ErrNotPaused is returned by [Store.Resume] for a consumer that is not
// paused.
var ErrNotPaused = inboxdb.ErrNotPaused

// Paused reads consumer's pause ([idemstore.Store.Paused]).
func (s *Store) Paused(ctx context.Context, consumer string) (idemstore.Pause, error) {
	return s.inbox.Paused(ctx, consumer)
}

// PausedIn is Paused read in tx, a transaction the caller holds.
func (s *Store) PausedIn(ctx context.Context, tx pgx.Tx, consumer string) (idemstore.Pause, error) {
	return s.inbox.PausedIn(ctx, inboxdb.PgxTxConn(tx), consumer)
}

// Pause pauses consumer everywhere: every processor of it holds its
// messages, unapplied and without spending their attempts, within seconds
// and until [Store.Resume]. by and why are kept with the pause and in the
// audit table idem_consumer_pause_log. Pausing a paused consumer changes
// nothing and returns the pause in force, with already set.
func (s *Store) Pause(ctx context.Context, consumer, by, why string) (p idemstore.Pause, already bool, err error) {
	return s.inbox.Pause(ctx, consumer, by, why)
}

// Resume ends consumer's pause and returns it; by and why go to the audit
// table. A consumer that is not paused is refused with [ErrNotPaused].
func (s *Store) Resume(ctx context.Context, consumer, by, why string) (idemstore.Pause, error) {
	return s.inbox.Resume(ctx, consumer, by, why)
}

// Pauses lists the paused consumers of the inbox, by name.
func (s *Store) Pauses(ctx context.Context) ([]ConsumerPause, error) {
	return s.inbox.Pauses(ctx)
}
