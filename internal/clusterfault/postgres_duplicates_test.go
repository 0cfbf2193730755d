package clusterfault

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// Redeliveries after a rebalance or a replay arrive together: every
// worker's batch is duplicates. On a server with synchronous standbys each
// such claim must wait for the standbys before it answers Duplicate, and
// that wait must not need a second connection of the pool: with as many
// workers as connections, each holding its transaction, a wait for
// another connection never ends. Four workers on a pool of two, and on a
// pool of one, answer Duplicate, each after a COMMIT that waited for the
// standby (seen in pg_stat_activity as a SyncRep wait while the walsender
// is stopped).
func TestPostgresConcurrentDuplicatesOnSyncStandby(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	startPostgres(t, "sync")
	for _, conns := range []int{2, 1} {
		t.Run(fmt.Sprintf("pool of %d", conns), func(t *testing.T) {
			schema := fmt.Sprintf("duplicates_%d", conns)
			_, store := pgInbox(t, ctx, schema, fmt.Sprintf("&pool_max_conns=%d", conns))
			failed := &failedTries{}
			proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
				Consumer: "ledger", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Hooks:     []idem.Hook{failed},
				Handler:   func(context.Context, pgx.Tx, idem.Message) error { return nil },
				TxTimeout: 20 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			const workers = 4
			msg := func(i int) idem.Message {
				return idem.Message{ID: fmt.Sprintf("dup-%d", i), Body: []byte("x"), Time: time.Now()}
			}
			for i := range workers {
				if r := proc.Process(ctx, msg(i)); r.Outcome != idem.Applied {
					t.Fatalf("first delivery of %d: %v (%v)", i, r.Outcome, r.Err)
				}
			}
			waitReplayed(t)

			// With the walsender stopped, a COMMIT that waits for the
			// standby shows as a SyncRep wait; one that does not wait
			// returns at once.
			admin, err := pgx.Connect(ctx, pgURL(pgPrimaryAddr, schema, ""))
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			var walsender int
			if err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&walsender); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(walsender, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					_ = syscall.Kill(walsender, syscall.SIGCONT)
				}
			}
			defer resume()
			results := make(chan idem.Result, workers)
			var wg sync.WaitGroup
			for i := range workers {
				wg.Add(1)
				go func() { defer wg.Done(); results <- proc.Process(ctx, msg(i)) }()
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				var waiting int
				if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if waiting > 0 {
					break
				}
				select {
				case r := <-results:
					t.Fatalf("a duplicate was answered (%v, %v) while the standby could not have the marker: no COMMIT waited for it", r.Outcome, r.Err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("no claim's COMMIT waited for the standby within 30s (pool of %d: the barrier waits on a connection that never comes?)", conns)
				}
				time.Sleep(10 * time.Millisecond)
			}
			resume()
			all := make(chan struct{})
			go func() { wg.Wait(); close(all) }()
			select {
			case <-all:
			case <-time.After(pgStall):
				t.Fatalf("the redeliveries were not answered within %v of the walsender's resumption (%d tries failed)", pgStall, failed.n.Load())
			}
			close(results)
			for r := range results {
				if r.Outcome != idem.Duplicate {
					t.Errorf("redelivery: %v (%v), want Duplicate", r.Outcome, r.Err)
				}
			}
			// A try that waited for a connection the pool never had fails
			// at TxTimeout as an outage, and is tried again: none may.
			if n := failed.n.Load(); n != 0 {
				t.Errorf("%d tries failed (last: %v); want every redelivery answered on its first try", n, failed.last.Load())
			}
		})
	}
}

// failedTries counts the processor's failed tries (idem.AttemptHook).
type failedTries struct {
	n    atomic.Int64
	last atomic.Value
}

func (f *failedTries) OnAttempt(_ string, a idem.Attempt) {
	f.n.Add(1)
	f.last.Store(fmt.Sprint(a.Err))
}
