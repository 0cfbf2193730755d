package clusterfault

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// TestPostgresTerminatedWaiter: with synchronous replication, a backend
// terminated while its COMMIT waits for the standby has committed on the
// primary alone, and its marker is visible there at once. The processor
// sees the commit's outcome as unknown and tries again; its claim finds
// the marker. Were that Duplicate acknowledged then, a failover before the
// standby caught up would lose the message (the promoted standby has
// neither marker nor effect). The store must not answer until the standby
// holds the marker: here it never does (the walsender is stopped), the
// primary is killed and the standby promoted, and the message must end
// applied, once, on the new primary.
func TestPostgresTerminatedWaiter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := startPostgres(t, "sync")
	schema := "terminated"
	_, store := pgInbox(t, ctx, schema, "")
	pgExec(t, pgURL(pgPrimaryAddr, schema, ""), `CREATE TABLE ledger (message_id text NOT NULL)`)
	waitReplayed(t)
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, m.ID)
			return err
		},
		Retry: idem.RetryPolicy{WaitUnavailable: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, pgURL(pgPrimaryAddr, schema, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// awaitWaiter waits for a backend other than not to wait for the
	// standby, and returns it; or, if got answers first, its answer. It
	// fails, saying what it waited for, when neither comes within pgStall.
	awaitWaiter := func(got <-chan idem.Result, not int, what string) (int, *idem.Result) {
		t.Helper()
		deadline := time.Now().Add(pgStall)
		for {
			var pid int
			err := admin.QueryRow(ctx, `SELECT coalesce(min(pid), 0) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND pid <> $1`, not).Scan(&pid)
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			if pid != 0 {
				return pid, nil
			}
			select {
			case r := <-got:
				return 0, &r
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("no commit was waiting for the standby %v after %s, and the processor had not answered", pgStall, what)
			}
		}
	}

	pg.run("pause-wal")
	got := make(chan idem.Result, 1)
	go func() { got <- proc.Process(ctx, idem.Message{ID: "m-1", Body: []byte("x"), Time: time.Now()}) }()
	victim, _ := awaitWaiter(nil, 0, "the walsender stopped and the message was handed to the processor")
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, victim); err != nil {
		t.Fatal(err)
	}
	// The try after the unknown commit finds the marker; it must wait for
	// the standby too, not answer.
	if _, r := awaitWaiter(got, victim, fmt.Sprintf("the waiting backend (pid %d) was terminated", victim)); r != nil {
		pg.run("kill-primary")
		pg.run("promote")
		t.Fatalf("after the unknown commit the processor answered %v (err %v) without the standby holding the marker", r.Outcome, r.Err)
	}
	_ = admin.Close(context.Background())
	pg.run("kill-primary")
	pg.run("promote")
	var res idem.Result
	select {
	case res = <-got:
	case <-time.After(pgStall):
		t.Fatalf("the processor had not answered %v after the standby's promotion", pgStall)
	}

	np, err := pgx.Connect(ctx, pgURL(pgReplicaAddr, schema, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close(ctx)
	var rows int
	if err := np.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	f := Figure{Scenario: "postgres/sync: backend waiting for the standby terminated, then primary killed", Messages: 1, Kills: 2,
		Note: "outcome " + res.Outcome.String() + "; the retry's claim found the primary-only marker and waited for the standby"}
	acked := res.Outcome == idem.Applied || res.Outcome == idem.Duplicate
	if acked {
		f.Acked = 1
	}
	if acked && rows == 0 {
		f.Lost = 1
	}
	if rows > 1 {
		f.Doubled = 1
	}
	Record(t, f)
	if res.Outcome != idem.Applied || rows != 1 {
		t.Fatalf("outcome %v (err %v), %d ledger rows on the new primary; want Applied and 1", res.Outcome, res.Err, rows)
	}
}
