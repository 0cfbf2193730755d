package clusterfault

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL pair of scripts/cluster/postgres.sh.
const (
	pgPrimaryAddr = "127.0.0.1:5441"
	pgReplicaAddr = "127.0.0.1:5442"
)

// pgURL is a URL on the cluster's test database, in schema (by search_path).
// hosts is one address or several, comma-separated; extra is more query.
func pgURL(hosts, schema, extra string) string {
	u := "postgres://postgres@" + hosts + "/test?sslmode=disable&connect_timeout=2&search_path=" + schema
	if extra != "" {
		u += "&" + extra
	}
	return u
}

// pgFailoverURL is how a consumer reaches whichever node is primary: both
// hosts, and only a session that can write.
func pgFailoverURL(schema string) string {
	return pgURL(pgPrimaryAddr+","+pgReplicaAddr, schema, "target_session_attrs=read-write")
}

// pgCluster drives scripts/cluster/postgres.sh.
type pgCluster struct {
	t      testing.TB
	script string
}

// pgServerBinaries reports whether the PostgreSQL server binaries the script
// needs are installed.
func pgServerBinaries() bool {
	if d := os.Getenv("IDEM_PG_BIN"); d != "" {
		_, err := os.Stat(filepath.Join(d, "initdb"))
		return err == nil
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	return len(m) > 0
}

// startPostgres brings the pair up in mode (async or sync) and tears it down
// when the test ends. Without the server binaries the smoke case is skipped
// and the full suite fails.
func startPostgres(t testing.TB, mode string) *pgCluster {
	t.Helper()
	if !pgServerBinaries() {
		msg := "PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) not found under /usr/lib/postgresql/*/bin: install them with apt-get install postgresql, or set IDEM_PG_BIN"
		if Full() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	c := &pgCluster{t: t, script: filepath.Join("..", "..", "scripts", "cluster", "postgres.sh")}
	t.Cleanup(func() { c.run("down") })
	start := time.Now()
	c.run("up", mode)
	t.Logf("postgres %s pair up in %v (initdb, base backup, streaming)", mode, time.Since(start).Round(time.Millisecond))
	return c
}

// run runs one command of the script and fails the test if it fails.
func (c *pgCluster) run(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("postgres.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// pgExec runs statements on one node.
func pgExec(t testing.TB, url string, sqls ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	defer conn.Close(ctx)
	for _, s := range sqls {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// waitReplayed waits until the standby has replayed everything the primary
// wrote so far: the schema a test sets up must be on both nodes before the
// fault.
func waitReplayed(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	primary, err := pgx.Connect(ctx, pgURL(pgPrimaryAddr, "public", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close(ctx)
	replica, err := pgx.Connect(ctx, pgURL(pgReplicaAddr, "public", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close(ctx)
	var lsn string
	if err := primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	for {
		var done bool
		if err := replica.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&done); err != nil {
			t.Fatalf("waiting for the standby to replay %s: %v", lsn, err)
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the standby did not replay %s in time", lsn)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// syncWaiters counts the primary's backends waiting in COMMIT for the
// synchronous standby.
func syncWaiters(ctx context.Context, conn *pgx.Conn) (int, error) {
	var n int
	err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting backends waiting for the standby: %w", err)
	}
	return n, nil
}
