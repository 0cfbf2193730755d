package pgxinbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
)

// killDSNEnv names the schema a re-executed test binary prunes as the
// child of TestPruneKilledMidRun.
const killDSNEnv = "IDEM_TEST_PRUNE_DSN"

// TestPruneKilledMidRun: a prune SIGKILLed in the middle of its run leaves
// no marker gone without its key in a pruned-key summary, so a RefuseLate
// consumer refuses the late duplicate of every key it deleted; a rerun
// completes the job. The child process deletes the 1,500 oldest markers in
// batches of 100, blocks on the next one, which the test holds locked, and
// is killed there.
func TestPruneKilledMidRun(t *testing.T) {
	if dsn := os.Getenv(killDSNEnv); dsn != "" {
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		store, err := pgxinbox.New(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.Prune(context.Background(), retention.Options{BatchSize: 100})
		t.Fatalf("the child prune returned (%+v, %v) instead of waiting on the held marker", res, err)
	}
	t.Parallel()
	const markers, held = 3000, 1500
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Window: window})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, markers)
	claims := make([]idemstore.Claim, markers)
	for i := range keys {
		keys[i] = fmt.Sprintf("k-%04d", i)
		claims[i] = idemstore.Claim{Key: keys[i], MessageID: keys[i]}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.Claim(ctx, tx, "ledger", claims, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_inbox SET keep_until = now() - interval '40 days' + substr(key, 3)::int * interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.Background()) }()
	if _, err := lock.Exec(ctx, `SELECT key FROM idem_inbox WHERE consumer = 'ledger' AND key = $1 FOR UPDATE`, keys[held]); err != nil {
		t.Fatal(err)
	}
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPruneKilledMidRun$", "-test.count=1")
	child.Env = append(os.Environ(), killDSNEnv+"="+dsn)
	var out strings.Builder
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	left := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox`)
	for left > markers-held {
		select {
		case err := <-exited:
			t.Fatalf("the child prune ended (%v) with %d markers left:\n%s", err, left, out.String())
		case <-ctx.Done():
			t.Fatalf("the child prune left %d markers, want %d:\n%s", left, markers-held, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		left = scalar[int](t, pool, `SELECT count(*) FROM idem_inbox`)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	sums, err := store.PrunedSummaries(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	inSummary := func(k string) bool {
		for _, s := range sums {
			if s.Has(k) {
				return true
			}
		}
		return false
	}
	missing := 0
	for _, k := range keys[:held] {
		if !inSummary(k) {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("after the kill: %d of the %d deleted markers are in no summary (%d summaries stored)", missing, held, len(sums))
	}
	strict := processorWith(t, store, func(c *idem.Config[pgx.Tx]) { c.RefuseLate = true })
	if r := strict.Process(ctx, idem.Message{ID: keys[0]}); r.Outcome != idem.Expired {
		t.Fatalf("late duplicate of %s, pruned by the killed run: %v (%v), want Expired", keys[0], r.Outcome, r.Err)
	}
	for {
		res, err := store.Prune(ctx, retention.Options{BatchSize: 100})
		if err != nil {
			t.Fatalf("rerun: %v", err)
		}
		if !res.Skipped {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the killed prune's election was never given up")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if n := scalar[int](t, pool, `SELECT count(*) FROM idem_inbox`); n != 0 {
		t.Fatalf("after the rerun %d markers left, want 0", n)
	}
	if sums, err = store.PrunedSummaries(ctx, "ledger"); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !inSummary(k) {
			t.Fatalf("after the rerun: key %s is in no summary", k)
		}
	}
}
