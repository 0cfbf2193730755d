package pooltest_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/pooltest"
)

// The watchdog stops a binary whose code holds the pool's only connection
// and asks for another, naming the wait, instead of letting it hang: a
// child process (this test binary, re-run) waits for itself on a pgx pool
// and on a database/sql pool of one.
func TestWatchdogStopsAWaitForItself(t *testing.T) {
	if kind := os.Getenv("POOLTEST_CHILD"); kind != "" {
		waitForItself(t, kind)
		return
	}
	t.Parallel()
	for _, kind := range []string{"pgx", "sql"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestWatchdogStopsAWaitForItself$", "-test.v")
			cmd.Env = append(os.Environ(), "POOLTEST_CHILD="+kind)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("the child waited for itself past a minute: the watchdog did not stop it\n%s", out)
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "waits for a second connection") || !strings.Contains(string(out), "waitForItself") {
				t.Fatalf("child: %v, want exit status 2 naming the wait and its stack\n%s", err, out)
			}
		})
	}
}

// waitForItself holds the pool's only connection and asks for another,
// without a deadline.
func waitForItself(t *testing.T, kind string) {
	pooltest.SetStuck(2 * time.Second)
	ctx := context.Background()
	switch kind {
	case "pgx":
		pool := pooltest.OpenPgx(t, pgtest.Schema(t), 1)
		held, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release()
		_, _ = pool.Acquire(ctx)
	case "sql":
		db, err := sql.Open("pgx", pgtest.Schema(t))
		if err != nil {
			t.Fatal(err)
		}
		pooltest.SQL(t, db, 1)
		held, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		_, _ = db.Conn(ctx)
	}
	t.Fatal("the second connection was given")
}
