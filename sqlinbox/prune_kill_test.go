package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/retention"
)

// killChildEnv names the backend a re-executed test binary prunes as the
// child of TestPruneKilledMidRun; killDSNEnv its database.
const (
	killChildEnv = "IDEM_TEST_PRUNE_CHILD"
	killDSNEnv   = "IDEM_TEST_PRUNE_DSN"
	killBatchEnv = "IDEM_TEST_PRUNE_BATCH"
)

// killBackend is one database TestPruneKilledMidRun prunes: how to open it
// from a DSN, and its SQL for the test's own statements.
type killBackend struct {
	name    string
	dialect Dialect
	// fresh makes a database of the test's own and returns its DSN.
	fresh func(t *testing.T) string
	open  func(dsn string) (*sql.DB, error)
	// age gives marker k-NNNN a keep_until NNNN seconds after a time past
	// every window; lock locks marker $1 for the transaction, or when
	// empty, settings locks the table's settings row (see
	// TestPruneKilledMidRun).
	age, lock, settings string
}

func killBackends(t *testing.T) []killBackend {
	pg := killBackend{
		name: "postgres", dialect: Postgres,
		fresh: func(t *testing.T) string { return pgtest.Schema(t) },
		open:  func(dsn string) (*sql.DB, error) { return sql.Open("pgx", dsn) },
		age:   `UPDATE idem_inbox SET keep_until = now() - interval '40 days' + substr(key, 3)::int * interval '1 second'`,
		lock:  `SELECT key FROM idem_inbox WHERE consumer = 'ledger' AND key = $1 FOR UPDATE`,
	}
	my := killBackend{
		name: "mysql", dialect: MySQL,
		fresh: func(t *testing.T) string {
			cfg := mysqltest.Database(t, "idem_t_")
			cfg.ParseTime, cfg.Loc = true, time.UTC
			cfg.Params = map[string]string{"sql_mode": "CONCAT(@@sql_mode, ',ANSI_QUOTES')", "time_zone": "'+00:00'"}
			return cfg.FormatDSN()
		},
		open: func(dsn string) (*sql.DB, error) {
			cfg, err := mysql.ParseDSN(dsn)
			if err != nil {
				return nil, err
			}
			conn, err := mysql.NewConnector(cfg)
			if err != nil {
				return nil, err
			}
			return sql.OpenDB(conn), nil
		},
		age:  `UPDATE idem_inbox SET keep_until = UTC_TIMESTAMP(6) - INTERVAL 40 DAY + INTERVAL CAST(SUBSTRING("key", 3) AS UNSIGNED) SECOND`,
		lock: `SELECT "key" FROM idem_inbox WHERE consumer = 'ledger' AND "key" = ? FOR UPDATE`,
	}
	// MariaDB's DELETE ... ORDER BY keep_until LIMIT reads (and locks)
	// every expired marker before it deletes the first: a held marker
	// stops its first batch. Its child is stopped by the lock on the
	// settings row instead, which a batch takes first (before the fix the
	// prune took it only for its final summary).
	maria := my
	maria.name, maria.dialect, maria.lock = "mariadb", MariaDB, ""
	maria.settings = `SELECT table_name FROM idem_inbox_settings WHERE table_name = ? FOR UPDATE`
	if t == nil {
		return []killBackend{pg, my, maria}
	}
	out := []killBackend{pg, my}
	var version string
	db, err := my.open(mysqltest.ServerDSN(t))
	if err == nil {
		err = db.QueryRow("SELECT VERSION()").Scan(&version)
		_ = db.Close()
	}
	if err != nil {
		t.Fatalf("asking the MySQL server its version: %v", err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		out = append(out, maria)
	}
	return out
}

// TestPruneKilledMidRun: a prune SIGKILLed in the middle of its run (a job
// scheduler's deadline, an OOM kill) leaves no marker gone without its key
// in a pruned-key summary, so a RefuseLate consumer refuses the late
// duplicate of every key it deleted; a rerun completes the job. The child
// process blocks on a marker the test holds locked, after it has deleted
// the 1,500 markers before it in batches of 100 (on MariaDB, on the
// settings row the test takes after the child's first batch), and is
// killed there.
func TestPruneKilledMidRun(t *testing.T) {
	if name := os.Getenv(killChildEnv); name != "" {
		batch, err := strconv.Atoi(os.Getenv(killBatchEnv))
		if err != nil {
			t.Fatal(err)
		}
		pruneChild(t, name, os.Getenv(killDSNEnv), batch)
		return
	}
	const markers, held = 3000, 1500
	for _, b := range killBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			dsn := b.fresh(t)
			db, err := b.open(dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			s := migrated(t, db, b.dialect)
			keys := make([]string, markers)
			claims := make([]idemstore.Claim, markers)
			for i := range keys {
				keys[i] = fmt.Sprintf("k-%04d", i)
				claims[i] = idemstore.Claim{Key: keys[i], MessageID: keys[i]}
			}
			tx, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Claim(ctx, tx, "ledger", claims, 0); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, b.age); err != nil {
				t.Fatal(err)
			}
			lock, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = lock.Rollback() }()
			batch, stop := 100, markers-held
			if b.lock != "" {
				// The marker after the first 1,500 (in keep_until order)
				// is held: the child's batch that reaches it waits there.
				var got string
				if err := lock.QueryRowContext(ctx, b.lock, keys[held]).Scan(&got); err != nil {
					t.Fatal(err)
				}
			} else {
				// Batches of 10: the child is still at it when the test
				// sees its first batch, and takes the settings row.
				batch, stop = 10, markers-1
			}

			child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPruneKilledMidRun$", "-test.count=1")
			child.Env = append(os.Environ(), killChildEnv+"="+b.name, killDSNEnv+"="+dsn, killBatchEnv+"="+fmt.Sprint(batch))
			var out strings.Builder
			child.Stdout, child.Stderr = &out, &out
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- child.Wait() }()
			left := countMarkers(ctx, t, db)
			for left > stop {
				select {
				case err := <-exited:
					t.Fatalf("the child prune ended (%v) with %d markers left:\n%s", err, left, out.String())
				case <-ctx.Done():
					t.Fatalf("the child prune left %d markers, want at most %d:\n%s", left, stop, out.String())
				case <-time.After(5 * time.Millisecond):
				}
				left = countMarkers(ctx, t, db)
			}
			if b.lock == "" {
				var got string
				if err := lock.QueryRowContext(ctx, b.settings, "\"idem_inbox\"").Scan(&got); err != nil {
					t.Fatal(err)
				}
				if n := countMarkers(ctx, t, db); n == 0 {
					t.Fatalf("the child deleted every marker before the settings row was taken: batches of %d are too fast to stop it", batch)
				}
			}
			select {
			case err := <-exited:
				t.Fatalf("the child prune ended (%v) before it was killed:\n%s", err, out.String())
			default:
			}
			if err := child.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-exited
			if err := lock.Rollback(); err != nil {
				t.Fatal(err)
			}

			// Whatever the killed run deleted is in a summary.
			gone := missingKeys(ctx, t, db, keys)
			if len(gone) < markers-stop || len(gone) == markers {
				t.Fatalf("%d markers gone after the kill, want at least %d and not all", len(gone), markers-stop)
			}
			sums, err := s.PrunedSummaries(ctx, "ledger")
			if err != nil {
				t.Fatal(err)
			}
			if n := unsummarised(sums, gone); n > 0 {
				t.Fatalf("after the kill: %d of the %d deleted markers are in no summary (%d summaries stored)", n, len(gone), len(sums))
			}
			p, err := idem.NewProcessor(s, &idem.Config[*sql.Tx]{
				Consumer:   "ledger",
				Key:        idem.ByMessageID,
				RefuseLate: true,
				Handler:    func(context.Context, *sql.Tx, idem.Message) error { return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			if r := p.Process(ctx, idem.Message{ID: gone[0]}); r.Outcome != idem.Expired {
				t.Fatalf("late duplicate of %s, pruned by the killed run: %v (%v), want Expired", gone[0], r.Outcome, r.Err)
			}

			// A rerun, once the killed session's lock is gone, deletes the
			// rest and summarises it.
			var res retention.Result
			for {
				res, err = s.Prune(ctx, retention.Options{BatchSize: 100})
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
			if n := countMarkers(ctx, t, db); n != 0 || res.Markers != int64(markers-len(gone)) {
				t.Fatalf("after the rerun: %d markers left, rerun deleted %d; want 0 left, %d deleted", n, res.Markers, markers-len(gone))
			}
			if sums, err = s.PrunedSummaries(ctx, "ledger"); err != nil {
				t.Fatal(err)
			}
			if n := unsummarised(sums, keys); n > 0 {
				t.Fatalf("after the rerun: %d of %d keys are in no summary", n, len(keys))
			}
		})
	}
}

// pruneChild is the child process of TestPruneKilledMidRun: it prunes
// until it is killed.
func pruneChild(t *testing.T, name, dsn string, batch int) {
	for _, b := range killBackends(nil) {
		if b.name != name {
			continue
		}
		db, err := b.open(dsn)
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(db, b.dialect, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Prune(context.Background(), retention.Options{BatchSize: batch})
		t.Fatalf("the child prune returned (%+v, %v) instead of waiting on the held lock", res, err)
	}
	t.Fatalf("unknown backend %q", name)
}

func migrated(t *testing.T, db *sql.DB, d Dialect) *Store {
	t.Helper()
	s, err := New(db, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func countMarkers(ctx context.Context, t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// missingKeys is the keys of keys that have no marker.
func missingKeys(ctx context.Context, t *testing.T, db *sql.DB, keys []string) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT "key" FROM idem_inbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		have[k] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		if !have[k] {
			out = append(out, k)
		}
	}
	return out
}

// unsummarised counts the keys no summary holds.
func unsummarised(sums []idemstore.PrunedSummary, keys []string) int {
	n := 0
	for _, k := range keys {
		found := false
		for _, s := range sums {
			if s.Has(k) {
				found = true
				break
			}
		}
		if !found {
			n++
		}
	}
	return n
}

// TestPoolOfOneMaintenance: on a database/sql pool of one connection
// (SetMaxOpenConns(1)), Migrate, Prune in batches with its summaries,
// Stats and SetWindow return. Before, the prune's final summary asked the
// pool for a second connection while the leader's session held the only
// one, and never returned.
func TestPoolOfOneMaintenance(t *testing.T) {
	const markers = 1000
	for _, b := range killBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			db, err := b.open(b.fresh(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			db.SetMaxOpenConns(1)
			s, err := New(db, b.dialect, nil)
			if err != nil {
				t.Fatal(err)
			}
			bounded(t, "Migrate", func(ctx context.Context) error { return s.Migrate(ctx) })
			claims := make([]idemstore.Claim, markers)
			for i := range claims {
				k := fmt.Sprintf("k-%04d", i)
				claims[i] = idemstore.Claim{Key: k, MessageID: k}
			}
			bounded(t, "claiming", func(ctx context.Context) error {
				tx, err := s.Begin(ctx)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				if _, err := s.Claim(ctx, tx, "ledger", claims, 0); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, b.age); err != nil {
					return err
				}
				return tx.Commit()
			})
			var res retention.Result
			bounded(t, "Prune", func(ctx context.Context) (err error) {
				res, err = s.Prune(ctx, retention.Options{BatchSize: 100})
				return err
			})
			if res.Markers != markers || res.Summaries != 1 {
				t.Fatalf("prune on a pool of one: %+v, want %d markers and 1 summary", res, markers)
			}
			var sums []idemstore.PrunedSummary
			bounded(t, "PrunedSummaries", func(ctx context.Context) (err error) {
				sums, err = s.PrunedSummaries(ctx, "ledger")
				return err
			})
			keys := make([]string, markers)
			for i, c := range claims {
				keys[i] = c.Key
			}
			if n := unsummarised(sums, keys); n > 0 {
				t.Fatalf("%d of %d keys pruned on a pool of one are in no summary", n, markers)
			}
			bounded(t, "Stats", func(ctx context.Context) error { _, err := s.Stats(ctx); return err })
			bounded(t, "SetWindow", func(ctx context.Context) error { _, err := s.SetWindow(ctx, 30*24*time.Hour, false); return err })
		})
	}
}

// bounded runs op and fails t when it has not returned within a minute: an
// operation that waits for a second connection of a pool of one never
// does.
func bounded(t *testing.T, what string, op func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s on a pool of one: %v", what, err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s on a pool of one has not returned after a minute: it waits for a second connection while it holds the only one", what)
	}
}

// TestLateDuplicateRightAfterPrune: a running RefuseLate processor, whose
// pruned-key summaries were loaded before a prune, refuses an untimed
// duplicate of a key that prune removed, sent right after it. Before, it
// applied it for up to a minute (the summaries were cached with the
// settings).
func TestLateDuplicateRightAfterPrune(t *testing.T) {
	for _, b := range killBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db, err := b.open(b.fresh(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			s := migrated(t, db, b.dialect)
			applied := 0
			p, err := idem.NewProcessor(s, &idem.Config[*sql.Tx]{
				Consumer:   "ledger",
				Key:        idem.ByMessageID,
				RefuseLate: true,
				Handler:    func(context.Context, *sql.Tx, idem.Message) error { applied++; return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"k-0001", "k-0002"} {
				if r := p.Process(ctx, idem.Message{ID: id}); r.Outcome != idem.Applied {
					t.Fatalf("first delivery of %s: %v (%v)", id, r.Outcome, r.Err)
				}
			}
			// k-0001's marker expires; k-0002's stays.
			if _, err := db.ExecContext(ctx, b.age+` WHERE consumer = 'ledger' AND `+quoteKey(b)+` = 'k-0001'`); err != nil {
				t.Fatal(err)
			}
			res, err := s.Prune(ctx, retention.Options{})
			if err != nil || res.Markers != 1 {
				t.Fatalf("prune: %+v %v, want 1 marker", res, err)
			}
			if r := p.Process(ctx, idem.Message{ID: "k-0001"}); r.Outcome != idem.Expired || r.PrunedOn.IsZero() {
				t.Fatalf("untimed duplicate of a key pruned a moment ago: %v (%v), want Expired (probable late duplicate)", r.Outcome, r.Err)
			}
			if r := p.Process(ctx, idem.Message{ID: "k-0002"}); r.Outcome != idem.Duplicate {
				t.Fatalf("duplicate of a kept key: %v (%v), want Duplicate", r.Outcome, r.Err)
			}
			if r := p.Process(ctx, idem.Message{ID: "k-0003"}); r.Outcome != idem.Applied {
				t.Fatalf("a new key: %v (%v), want Applied", r.Outcome, r.Err)
			}
			if applied != 3 {
				t.Fatalf("handler ran %d times, want 3 (k-0001 once, k-0002, k-0003)", applied)
			}
			if n := countMarkers(ctx, t, db); n != 2 {
				t.Fatalf("%d markers, want 2 (the refused duplicate's claim rolled back)", n)
			}
		})
	}
}

// quoteKey is the key column as b's SQL names it.
func quoteKey(b killBackend) string {
	if b.name == "postgres" {
		return "key"
	}
	return `"key"`
}
