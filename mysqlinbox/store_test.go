package mysqlinbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
)

func claim(t *testing.T, s *sqlinbox.Store, tx *sql.Tx, lock time.Duration, keys ...string) ([]bool, error) {
	t.Helper()
	cs := make([]idem.Claim, len(keys))
	for i, k := range keys {
		cs[i] = idem.Claim{Key: k, MessageID: "m-" + k}
	}
	return s.Claim(context.Background(), tx, "c", cs, lock)
}

// TestLockWaitTimeoutIsBusy: a claim waiting on a key another transaction
// holds ends after the lock timeout (whole seconds on MySQL) with 1205,
// classified busy, and the holder's marker stays.
func TestLockWaitTimeoutIsBusy(t *testing.T) {
	ctx := context.Background()
	s := migrated(t, freshDB(t), nil)
	holder, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback() }()
	if got, err := claim(t, s, holder, 0, "k"); err != nil || !got[0] {
		t.Fatalf("holder's claim: %v %v", got, err)
	}
	waiter, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = waiter.Rollback() }()
	start := time.Now()
	_, err = claim(t, s, waiter, 300*time.Millisecond, "k")
	if err == nil {
		t.Fatal("the waiter's claim succeeded while the holder held the key")
	}
	if c := s.Classify(err); c != idem.ClassBusy {
		t.Errorf("lock wait timeout %v: class %v, want busy", err, c)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the claim waited %v: the lock timeout was not applied", d)
	}
}

// TestDeadlockIsBusy: two transactions claiming two keys in opposite orders
// deadlock; InnoDB ends one with 1213, classified busy.
func TestDeadlockIsBusy(t *testing.T) {
	ctx := context.Background()
	s := migrated(t, freshDB(t), nil)
	a, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Rollback() }()
	b, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Rollback() }()
	if _, err := claim(t, s, a, 0, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := claim(t, s, b, 0, "y"); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, err := claim(t, s, a, 0, "y"); errs <- err }()
	go func() { defer wg.Done(); _, err := claim(t, s, b, 0, "x"); errs <- err }()
	// The survivor waits on the victim's rows until the victim rolls back.
	var failed error
	for range 2 {
		if err := <-errs; err != nil && failed == nil {
			failed = err
			_ = a.Rollback()
			_ = b.Rollback()
		}
	}
	wg.Wait()
	if failed == nil {
		t.Fatal("crossed claims did not deadlock")
	}
	if c := s.Classify(failed); c != idem.ClassBusy {
		t.Errorf("deadlock %v: class %v, want busy", failed, c)
	}
}

// TestClassifyServerErrors classifies errors the server really returns.
func TestClassifyServerErrors(t *testing.T) {
	ctx := context.Background()
	db := freshDB(t)
	s := migrated(t, db, nil)
	if _, err := db.Exec(`CREATE TABLE uniq (k VARBINARY(10) PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	_, dup := db.Exec(`INSERT INTO uniq VALUES ('a'), ('a')`)
	_, long := db.Exec(`INSERT INTO uniq VALUES ('01234567890')`)
	_, missing := db.Exec(`SELECT * FROM no_such_table`)
	for _, c := range []struct {
		name string
		err  error
		want idem.ErrorClass
	}{
		{"duplicate entry (1062)", dup, idem.ClassPermanent},
		{"data too long (1406)", long, idem.ClassPermanent},
		{"missing table (1146)", missing, idem.ClassConfig},
		{"bad connection", driverBadConn(), idem.ClassUnavailable},
		{"handler error", errors.New("boom"), idem.ClassTransient},
	} {
		if c.err == nil {
			t.Errorf("%s: the statement did not fail", c.name)
			continue
		}
		if got := s.Classify(c.err); got != c.want {
			t.Errorf("%s (%v): class %v, want %v", c.name, c.err, got, c.want)
		}
	}
	// A claim on a dropped table is a configuration error.
	if _, err := db.Exec(`DROP TABLE idem_inbox`); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	_, err = claim(t, s, tx, 0, "k")
	if c := s.Classify(err); err == nil || c != idem.ClassConfig {
		t.Errorf("claim on a dropped inbox: %v, class %v, want config", err, c)
	}
}

// TestCommitLostConnectionIsUnknown: a COMMIT whose connection is cut gets
// no answer, and the store reports its outcome unknown.
func TestCommitLostConnectionIsUnknown(t *testing.T) {
	ctx := context.Background()
	var p *netfault.Proxy
	db, _ := freshDBVia(t, func(target string) string { p = netfault.New(t, target); return p.Addr() })
	s := migrated(t, db, nil)
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := claim(t, s, tx, 0, "k"); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	err = s.Commit(ctx, tx)
	if !errors.Is(err, idem.ErrCommitUnknown) {
		t.Fatalf("commit over a cut connection: %v, want ErrCommitUnknown", err)
	}
	p.Restore()
}

// TestMigrateTwiceAndCheck: migrating again is a no-op, and Check finds
// nothing wrong with a migrated table; a table without the primary key is
// reported.
func TestMigrateTwiceAndCheck(t *testing.T) {
	ctx := context.Background()
	db := freshDB(t)
	s := migrated(t, db, nil)
	rep, err := s.MigrateReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Created || rep.From != rep.To {
		t.Errorf("second migrate: %+v, want nothing to do", rep)
	}
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 0 {
		t.Errorf("Check of a migrated table: %v", probs)
	}
	if _, err := db.Exec(`ALTER TABLE idem_inbox DROP PRIMARY KEY`); err != nil {
		t.Fatal(err)
	}
	probs, err = s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) == 0 || !strings.Contains(probs[0].What, "no unique key") {
		t.Errorf("Check of a table without its primary key: %v", probs)
	}
}

// TestDDLMatchesMigrate: the rendered DDL, applied twice, leaves a table
// Check accepts and the store claims on.
func TestDDLMatchesMigrate(t *testing.T) {
	ctx := context.Background()
	db := freshDB(t)
	up, err := sqlinbox.DDL(sqlinbox.MySQL, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	for range 2 {
		for _, stmt := range splitScript(up) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("applying %q: %v", stmt, err)
			}
		}
	}
	s, err := mysqlinbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	probs, err := s.Check(ctx)
	if err != nil || len(probs) != 0 {
		t.Fatalf("Check after the DDL: %v %v", probs, err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after the DDL: %v", err)
	}
}

// TestPruneAndStats: the prune deletes expired markers in batches and the
// stats and per-consumer stats read the table.
func TestPruneAndStats(t *testing.T) {
	ctx := context.Background()
	db := freshDB(t)
	s := migrated(t, db, nil)
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 25)
	for i := range keys {
		keys[i] = string(rune('a'+i)) + "-key"
	}
	if _, err := claim(t, s, tx, 0, keys...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// Age 20 of them past the window.
	if _, err := db.Exec(`UPDATE idem_inbox SET keep_until = UTC_TIMESTAMP(6) - INTERVAL 30 DAY, processed_at = UTC_TIMESTAMP(6) - INTERVAL 30 DAY WHERE "key" < 'u'`); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != 25 || st.Prunable != 20 {
		t.Errorf("stats: %+v, want 25 rows, 20 prunable", st)
	}
	cs, err := s.ConsumerStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Consumers) != 1 || cs.Consumers[0].Consumer != "c" {
		t.Errorf("consumer stats: %+v", cs)
	}
	res, err := s.Prune(ctx, retention.Options{BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	if res.Markers != 20 || res.Batches < 3 {
		t.Errorf("prune: %+v, want 20 markers in at least 3 batches", res)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil || n != 5 {
		t.Errorf("after the prune: %d markers (%v), want 5", n, err)
	}
}

func driverBadConn() error { return errors.Join(errors.New("claiming"), driver.ErrBadConn) }

// splitScript cuts a rendered script at the semicolons that end its lines,
// leaving out comment lines.
func splitScript(script string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(script) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			if s := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"); s != "" {
				out = append(out, s)
			}
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// TestConcurrentMigrate: migrators starting together on a new database all
// succeed (MySQL DDL commits implicitly, so they are not serialized: every
// statement is idempotent) and leave one table at the newest version.
func TestConcurrentMigrate(t *testing.T) {
	db := freshDB(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			s, err := mysqlinbox.New(db, nil)
			if err == nil {
				err = s.Migrate(context.Background())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent migrate: %v", err)
		}
	}
	s := migrated(t, db, nil)
	if probs, err := s.Check(context.Background()); err != nil || len(probs) != 0 {
		t.Errorf("Check after concurrent migrations: %v %v", probs, err)
	}
}
