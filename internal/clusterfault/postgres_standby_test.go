package clusterfault

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgerr"
)

// TestPostgresColdStandby: with the primary dead and the standby not yet
// accepting connections (hot_standby=off gives the 57P03
// cannot_connect_now a standby answers until it is consistent), a consumer
// on the multi-host URL meets only refusals: an outage, held without
// spending attempts (a budget of one would dead-letter otherwise). Once the
// standby is promoted the same processor applies the message.
func TestPostgresColdStandby(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := startPostgres(t, "async")
	schema := "cold"
	_, store := pgInbox(t, ctx, schema, "")
	pgExec(t, pgURL(pgPrimaryAddr, schema, ""), `CREATE TABLE ledger (message_id text NOT NULL)`)
	waitReplayed(t)
	pg.run("cold-standby")
	_, err := pgx.Connect(ctx, pgURL(pgReplicaAddr, schema, ""))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57P03" || pgerr.Classify(err) != idemstore.ClassUnavailable {
		t.Fatalf("connecting to a standby without hot standby: %v (class %v); want 57P03, unavailable", err, pgerr.Classify(err))
	}
	pg.run("kill-primary")

	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, m.ID)
			return err
		},
		Retry: idem.RetryPolicy{MaxAttempts: 1, WaitUnavailable: 500 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := idem.Message{ID: "m-1", Body: []byte("x"), Time: time.Now()}
	res := proc.Process(ctx, msg)
	if res.Outcome != idem.Retry || !res.Blameless || !errors.Is(res.Err, idem.ErrUnavailable) {
		t.Fatalf("no node accepting connections: outcome %v blameless %v err %v; want a blameless Retry wrapping ErrUnavailable", res.Outcome, res.Blameless, res.Err)
	}
	pg.run("promote")
	if res := proc.Process(ctx, msg); res.Outcome != idem.Applied {
		t.Fatalf("after the promotion: outcome %v err %v; want Applied", res.Outcome, res.Err)
	}
}
