package mysqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// A handler whose own deadline cuts its query short on a pool of one: the
// database answers, so the message is at fault and ends in a dead letter,
// instead of being held forever because the outage test waited for the
// connection the failed transaction still held.
func TestHandlersOwnDeadlineOnAPoolOfOneIsTheMessagesFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := freshDB(t)
	db.SetMaxOpenConns(1)
	store := migrated(t, db, nil)
	p, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "slow", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx *sql.Tx, _ idem.Message) error {
			qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := tx.ExecContext(qctx, `SELECT SLEEP(1)`)
			return err
		},
		Retry: idem.RetryPolicy{MaxAttempts: 2, WaitUnavailable: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Process(ctx, idem.Message{ID: "slow-1", Body: []byte("x"), Time: time.Now()})
	if res.Outcome != idem.DeadLettered || res.Blameless || errors.Is(res.Err, idem.ErrUnavailable) {
		t.Fatalf("outcome %v blameless %v attempts %d err %v; want a dead letter charged to the message", res.Outcome, res.Blameless, res.Attempts, res.Err)
	}
}
