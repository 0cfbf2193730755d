package clusterfault

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgxinbox"
)

// The full suite's pair (make cluster-faults), as scripts/cluster/postgres.sh
// places it by default; IDEM_PG_PRIMARY_PORT, IDEM_PG_REPLICA_PORT and
// IDEM_CLUSTER_DIR move it. The smoke cases of make test run each on a pair
// of its own, on free ports and in a fresh directory, so that they never
// meet the full suite's pair or another test process's.
const (
	pgFullPrimaryPort = "5441"
	pgFullReplicaPort = "5442"
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

// The addresses of the running case's pair, set by startPostgres. The
// cases on a pair run one at a time (none calls t.Parallel), which
// startPostgres checks.
var (
	pgPrimaryAddr string // the primary's, host:port
	pgReplicaAddr string // the standby's, promoted by promote
	pgInUse       sync.Mutex
)

// pgFailoverURL is how a consumer reaches whichever node is primary: both
// hosts, and only a session that can write.
func pgFailoverURL(schema string) string {
	return pgURL(pgPrimaryAddr+","+pgReplicaAddr, schema, "target_session_attrs=read-write")
}

// pgCluster drives scripts/cluster/postgres.sh for one pair.
type pgCluster struct {
	t      testing.TB
	script string
	env    []string // the script's environment: the pair's ports and directory
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

// startPostgres brings a pair up in mode (async or sync) and tears it down
// when the test ends. Without the server binaries the smoke case is skipped
// and the full suite fails.
//
// A case's faults kill its pair's primary or stop its walsender, so no two
// cases share a pair. The
// full suite's pair is on fixed ports: a lock file held for the case's life
// keeps a second full run (or anything else taking the lock) off it until
// this case tore it down. A smoke case takes two free ports and a directory
// of its own, removed at the end.
func startPostgres(t testing.TB, mode string) *pgCluster {
	t.Helper()
	if !pgServerBinaries() {
		msg := "PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) not found under /usr/lib/postgresql/*/bin: install them with apt-get install postgresql, or set IDEM_PG_BIN"
		if Full() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if !pgInUse.TryLock() {
		t.Fatal("another case's PostgreSQL pair is up: the cases on a pair must not run in parallel")
	}
	t.Cleanup(pgInUse.Unlock)
	c := &pgCluster{t: t, script: filepath.Join("..", "..", "scripts", "cluster", "postgres.sh")}
	start := time.Now()
	if Full() {
		pp, rp := envOr("IDEM_PG_PRIMARY_PORT", pgFullPrimaryPort), envOr("IDEM_PG_REPLICA_PORT", pgFullReplicaPort)
		lockPGPorts(t, pp)
		c.setPorts(pp, rp)
		t.Cleanup(func() { c.run("down") })
		c.run("up", mode)
	} else {
		// The script runs the servers as the postgres OS user, which must
		// reach the directory: os.MkdirTemp makes it 0700 for its creator.
		dir, err := os.MkdirTemp("", "idem-pg-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		c.env = append(c.env, "IDEM_CLUSTER_DIR="+dir)
		t.Cleanup(func() { c.run("down") })
		// A free port can be taken by someone else between its pick and
		// the server's bind: pick again then.
		var failures []string
		for len(failures) < 3 {
			ports := freePorts(t, 2)
			c.setPorts(ports[0], ports[1])
			out, err := c.exec("up", mode)
			if err == nil {
				break
			}
			failures = append(failures, fmt.Sprintf("on %s and %s: %v\n%s", pgPrimaryAddr, pgReplicaAddr, err, out))
		}
		if len(failures) == 3 {
			t.Fatalf("postgres.sh up %s failed three times:\n%s", mode, strings.Join(failures, "\n"))
		}
	}
	t.Logf("postgres %s pair up on %s and %s in %v (initdb, base backup, streaming)", mode, pgPrimaryAddr, pgReplicaAddr, time.Since(start).Round(time.Millisecond))
	return c
}

func (c *pgCluster) setPorts(primary, replica string) {
	pgPrimaryAddr, pgReplicaAddr = "127.0.0.1:"+primary, "127.0.0.1:"+replica
	c.env = append(c.env, "IDEM_PG_PRIMARY_PORT="+primary, "IDEM_PG_REPLICA_PORT="+replica)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// freePorts returns n distinct TCP ports free on 127.0.0.1 just now.
func freePorts(t testing.TB, n int) []string {
	t.Helper()
	var ports []string
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("picking a free port: %v", err)
		}
		defer l.Close()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return ports
}

// pgLockWait bounds the wait for another run's case on the full suite's
// ports.
const pgLockWait = 5 * time.Minute

// lockPGPorts holds, until t ends, an exclusive lock on a file named after
// the primary's port: two runs of the full suite take turns on the pair
// instead of one adopting, killing or removing the other's.
func lockPGPorts(t testing.TB, port string) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "idem-cluster-postgres-"+port+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("opening the pair's lock: %v", err)
	}
	deadline := time.Now().Add(pgLockWait)
	for logged := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			t.Fatalf("locking %s: %v", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			t.Fatalf("another run has held %s (the pair on port %s) for over %v: wait for it, or move this run with IDEM_PG_PRIMARY_PORT, IDEM_PG_REPLICA_PORT and IDEM_CLUSTER_DIR", path, port, pgLockWait)
		}
		if !logged {
			t.Logf("waiting for another run to release %s (the pair on port %s)", path, port)
			logged = true
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
}

// run runs one command of the script and fails the test if it fails.
func (c *pgCluster) run(args ...string) string {
	c.t.Helper()
	out, err := c.exec(args...)
	if err != nil {
		c.t.Fatalf("postgres.sh %s (%s, %s): %v\n%s", strings.Join(args, " "), pgPrimaryAddr, pgReplicaAddr, err, out)
	}
	return out
}

// exec runs one command of the script on the pair.
func (c *pgCluster) exec(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...)
	cmd.Env = append(os.Environ(), c.env...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
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
	const within = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	primary, err := pgx.Connect(ctx, pgURL(pgPrimaryAddr, "public", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close(context.Background())
	replica, err := pgx.Connect(ctx, pgURL(pgReplicaAddr, "public", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close(context.Background())
	var lsn string
	if err := primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	replayed := "nothing yet"
	for {
		var done bool
		err := replica.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false), coalesce(pg_last_wal_replay_lsn()::text, 'nothing')", lsn).Scan(&done, &replayed)
		if err != nil {
			t.Fatalf("waiting for the standby to replay %s (it stood at %s): %v", lsn, replayed, err)
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the standby did not replay the primary's WAL up to %s within %v: it stood at %s", lsn, within, replayed)
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

// pgInbox creates schema on the pair's primary and returns a pool on the
// failover URL (with extra query, such as pool_max_conns=2) and a migrated
// inbox in it; the pool closes when t ends.
func pgInbox(t testing.TB, ctx context.Context, schema, extra string) (*pgxpool.Pool, *pgxinbox.Store) {
	t.Helper()
	pgExec(t, pgURL(pgPrimaryAddr, "public", ""), "CREATE SCHEMA "+schema)
	pool, err := pgxpool.New(ctx, pgFailoverURL(schema)+extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return pool, store
}
