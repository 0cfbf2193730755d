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

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
)

func claim(t *testing.T, s *sqlinbox.Store, tx *sql.Tx, lock time.Duration, keys ...string) ([]bool, error) {
	t.Helper()
	cs := make([]idemstore.Claim, len(keys))
	for i, k := range keys {
		cs[i] = idemstore.Claim{Key: k, MessageID: "m-" + k}
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
	if c := s.Classify(err); c != idemstore.ClassBusy {
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
	if c := s.Classify(failed); c != idemstore.ClassBusy {
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
	if _, err := db.Exec(`CREATE TABLE nums (n TINYINT)`); err != nil {
		t.Fatal(err)
	}
	_, outOfRange := db.Exec(`INSERT INTO nums VALUES (1000)`)
	_, divZero := db.Exec(`INSERT INTO nums VALUES (1/0)`)
	_, keyTooLong := db.Exec(`CREATE TABLE keys_long (v VARCHAR(5000) CHARACTER SET utf8mb4 PRIMARY KEY)`)
	_, rowTooLarge := db.Exec(`CREATE TABLE rows_wide (a VARCHAR(30000), b VARCHAR(30000), c VARCHAR(30000)) CHARACTER SET latin1`)
	for _, c := range []struct {
		name string
		err  error
		want idemstore.ErrorClass
	}{
		{"duplicate entry (1062)", dup, idemstore.ClassPermanent},
		{"data too long (1406)", long, idemstore.ClassPermanent},
		{"missing table (1146)", missing, idemstore.ClassConfig},
		{"out of range (1264)", outOfRange, idemstore.ClassPermanent},
		{"division by zero (1365)", divZero, idemstore.ClassPermanent},
		{"key too long (1071)", keyTooLong, idemstore.ClassPermanent},
		{"row size too large (1118)", rowTooLarge, idemstore.ClassPermanent},
		{"bad connection", driverBadConn(), idemstore.ClassUnavailable},
		{"handler error", errors.New("boom"), idemstore.ClassTransient},
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
	if c := s.Classify(err); err == nil || c != idemstore.ClassConfig {
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
	for _, d := range dialects(t) {
		t.Run(d.Name(), func(t *testing.T) { testPruneAndStats(t, d) })
	}
}

// testPruneAndStats prunes 20 of 25 markers in batches of 7 with dialect
// d, on the test server: the MySQL dialect's batch (SELECT ... FOR UPDATE,
// then DELETE of the keys it locked; MySQL has no DELETE ... RETURNING)
// runs here on MariaDB, which accepts MySQL's syntax. The keys it deleted
// are summarised, and the others are not.
func testPruneAndStats(t *testing.T, d sqlinbox.Dialect) {
	ctx := context.Background()
	db := freshDB(t)
	s := migratedAs(t, db, d, nil)
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
	if res.Markers != 20 || res.Batches != 3 {
		t.Errorf("prune: %+v, want 20 markers in 3 batches", res)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM idem_inbox WHERE "key" >= 'u'`).Scan(&n); err != nil || n != 5 {
		t.Errorf("after the prune: %d live markers (%v), want the 5 inside the window", n, err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil || n != 5 {
		t.Errorf("after the prune: %d markers (%v), want 5", n, err)
	}
	sums, err := s.PrunedSummaries(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(sums) != 1 {
		t.Fatalf("%d summaries after the prune, want one", len(sums))
	}
	for _, k := range keys[:20] {
		if !sums[0].Has(k) {
			t.Errorf("the summary lacks pruned key %s", k)
		}
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
// succeed and leave one table at the newest version, with either dialect.
func TestConcurrentMigrate(t *testing.T) {
	for _, d := range dialects(t) {
		t.Run(d.Name(), func(t *testing.T) {
			db := freshDB(t)
			var wg sync.WaitGroup
			errs := make(chan error, 6)
			for range 6 {
				wg.Go(func() {
					s, err := sqlinbox.New(db, d, nil)
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
			s := migratedAs(t, db, d, nil)
			if probs, err := s.Check(context.Background()); err != nil || len(probs) != 0 {
				t.Errorf("Check after concurrent migrations: %v %v", probs, err)
			}
			var versions, settings int
			if err := db.QueryRow(`SELECT (SELECT count(*) FROM idem_migrations), (SELECT count(*) FROM idem_inbox_settings)`).Scan(&versions, &settings); err != nil {
				t.Fatal(err)
			}
			if versions != 1 || settings != 1 {
				t.Errorf("%d version rows and %d settings rows, want one each", versions, settings)
			}
		})
	}
}

// TestMigrateWaitsForTheLock: a migrator waits while another session holds
// the database's migration lock (GET_LOCK, which outlives the implicit
// commits of DDL), gives up when its context ends, and migrates once the
// lock is released.
func TestMigrateWaitsForTheLock(t *testing.T) {
	ctx := context.Background()
	db := freshDB(t)
	holder, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var got int
	if err := holder.QueryRowContext(ctx, `SELECT GET_LOCK(CONCAT('idem.migrate.', SHA1(DATABASE())), 0)`).Scan(&got); err != nil || got != 1 {
		t.Fatalf("taking the lock: %d %v", got, err)
	}
	s, err := sqlinbox.New(db, sqlinbox.MySQL, nil)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	err = s.Migrate(short)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "migration lock") {
		t.Fatalf("Migrate while another session holds the lock: %v, want a wait for the migration lock", err)
	}
	var tables int
	if err := db.QueryRow(`SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE()`).Scan(&tables); err != nil || tables != 0 {
		t.Errorf("%d tables (%v) after a migrator that did not get the lock, want none", tables, err)
	}
	if _, err := holder.ExecContext(ctx, `DO RELEASE_LOCK(CONCAT('idem.migrate.', SHA1(DATABASE())))`); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after the lock was released: %v", err)
	}
}

// TestConfigTimeouts: the dial, read and write timeouts are set when the
// DSN does not name them, and a DSN's own, 0 (no limit) included, is kept.
func TestConfigTimeouts(t *testing.T) {
	cfg, err := mysqlinbox.Config("root@tcp(127.0.0.1:3306)/test")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != mysqlinbox.DefaultDialTimeout || cfg.ReadTimeout != mysqlinbox.DefaultReadTimeout || cfg.WriteTimeout != mysqlinbox.DefaultWriteTimeout {
		t.Errorf("without timeouts in the DSN: timeout %v, read %v, write %v; want the defaults", cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout)
	}
	if !cfg.ParseTime || cfg.InterpolateParams {
		t.Errorf("parseTime %v, interpolateParams %v: want true, false", cfg.ParseTime, cfg.InterpolateParams)
	}
	cfg, err = mysqlinbox.Config("u:p?/x@tcp(127.0.0.1:3306)/test?readTimeout=0&timeout=2s&parseTime=false&interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != 2*time.Second || cfg.ReadTimeout != 0 || cfg.WriteTimeout != mysqlinbox.DefaultWriteTimeout || !cfg.ParseTime || !cfg.InterpolateParams {
		t.Errorf("with timeouts in the DSN: timeout %v, read %v, write %v, parseTime %v, interpolateParams %v; want 2s, 0, the default, true, true",
			cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout, cfg.ParseTime, cfg.InterpolateParams)
	}
}

// TestFrozenServerFailsClaimUnavailable: a server that stops answering in
// the middle of a transaction (a proxy that goes silent without cutting
// anything) makes the claim fail with a connection error that the store
// classifies unavailable, from the read timeout, rather than hang. The
// context has no deadline: only the driver's timeout can end the wait.
func TestFrozenServerFailsClaimUnavailable(t *testing.T) {
	var p *netfault.Proxy
	cfg := mysqltest.Database(t, "idem_t_")
	p = netfault.New(t, cfg.Addr)
	cfg.Addr = p.Addr()
	// The DSN's own readTimeout, short for the test; TestConfigTimeouts
	// pins the default a DSN without one gets.
	dsn := cfg.FormatDSN()
	if strings.Contains(dsn, "?") {
		dsn += "&"
	} else {
		dsn += "?"
	}
	db, err := mysqlinbox.Open(dsn + "readTimeout=2s&writeTimeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := migrated(t, db, nil)
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Freeze()
	defer p.Restore()
	_, err = claim(t, s, tx, time.Second, "k")
	if err == nil {
		t.Fatal("a claim on a frozen server succeeded")
	}
	if c := s.Classify(err); c != idemstore.ClassUnavailable {
		t.Errorf("claim on a frozen server: %v, classified %v, want unavailable", err, c)
	}
	_ = tx.Rollback()
}

// TestMigrateWithoutDatabase: a connection with no database selected makes
// the migration lock's name NULL, and GET_LOCK(NULL, …) answers NULL at
// once; the migrator refuses with a configuration error rather than poll
// until its context ends (which context.Background never does). Open and
// Config refuse such a DSN before any of that.
func TestMigrateWithoutDatabase(t *testing.T) {
	cfg := mysqltest.Database(t, "idem_t_")
	cfg.DBName = ""
	if _, err := mysqlinbox.Config(cfg.FormatDSN()); !errors.Is(err, idem.ErrConfig) || !strings.Contains(err.Error(), "names no database") {
		t.Errorf("Config without a database: %v, want ErrConfig naming the missing database", err)
	}
	if db, err := mysqlinbox.Open(cfg.FormatDSN()); !errors.Is(err, idem.ErrConfig) {
		if db != nil {
			_ = db.Close()
		}
		t.Errorf("Open without a database: %v, want ErrConfig", err)
	}
	// A *sql.DB of the caller's own, as sqlinbox.New takes one.
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	s, err := sqlinbox.New(db, sqlinbox.MySQL, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The deadline only bounds a migrator that spins: it ends in a context
	// error, not the configuration error wanted.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = s.Migrate(ctx)
	if !errors.Is(err, idem.ErrConfig) || !strings.Contains(err.Error(), "no database selected") {
		t.Fatalf("Migrate without a database: %v, want ErrConfig saying no database is selected", err)
	}
}
