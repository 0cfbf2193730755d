package idem

import (
	"context"
	"time"
)

// Store is the seam between a [Processor] and a database: an inbox table and
// the transactions around it. TTx is the store's own transaction type
// (pgx.Tx, *sql.Tx), handed unchanged to handlers.
//
// The interface is for store authors and may change between minor versions;
// every store must pass the shared conformance suite in package inboxtest.
type Store[TTx any] interface {
	// Begin starts a transaction.
	Begin(ctx context.Context) (TTx, error)
	// Commit commits tx. When the outcome is unknown (the connection failed
	// before the server answered) the error must wrap [ErrCommitUnknown].
	Commit(ctx context.Context, tx TTx) error
	// Rollback rolls tx back; it must be safe to call after a failed
	// statement.
	Rollback(ctx context.Context, tx TTx) error
	// Claim inserts one marker per claim in ONE statement, in the order given
	// (the processor sorts claims by key so that two batches with overlapping
	// keys cannot deadlock), skipping keys already present (ON CONFLICT DO
	// NOTHING). It reports, per claim, whether this transaction inserted it.
	// A concurrent claim of the same key blocks on the unique index until the
	// other transaction ends; lockTimeout bounds that wait where the database
	// supports it (0 means the database default).
	Claim(ctx context.Context, tx TTx, consumer string, claims []Claim, lockTimeout time.Duration) (inserted []bool, err error)
	// Lookup returns the markers that exist for keys, for logging duplicates.
	Lookup(ctx context.Context, tx TTx, consumer string, keys []string) (map[string]Marker, error)
	// Classify tells a transient error from a permanent one, by error type
	// and SQLSTATE, never by message text. Errors that are not the
	// database's (a handler's own) are transient.
	Classify(err error) ErrorClass
}

// Claim is one marker to insert.
type Claim struct {
	Key        string
	MessageID  string
	BodySHA256 []byte
	// EventTime is the message's event time (zero when unknown); stores that
	// partition the inbox by it require it.
	EventTime time.Time
}
