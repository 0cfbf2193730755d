package sqlinbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/retention"
)

// MySQLError has the shape of the driver's error type, which this package
// does not link (mysqlinbox's tests classify the driver's own errors).
type MySQLError struct {
	Number  uint16
	Message string
}

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d: %s", e.Number, e.Message) }

func TestLockWaitSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Millisecond: "1", 300 * time.Millisecond: "1", time.Second: "1",
		1200 * time.Millisecond: "2", 5 * time.Second: "5",
	} {
		if got := lockWaitSeconds(d); got != want {
			t.Errorf("lockWaitSeconds(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestMySQLClassify(t *testing.T) {
	wrap := func(n uint16) error { return fmt.Errorf("claiming: %w", &MySQLError{Number: n}) }
	for _, c := range []struct {
		err     error
		class   idemstore.ErrorClass
		unknown bool // as a COMMIT's error
	}{
		{wrap(1213), idemstore.ClassBusy, false},
		{wrap(1205), idemstore.ClassBusy, false},
		{wrap(1062), idemstore.ClassPermanent, false},
		{wrap(1146), idemstore.ClassConfig, false},
		{wrap(1045), idemstore.ClassConfig, false},
		{wrap(2006), idemstore.ClassUnavailable, true},
		{wrap(2013), idemstore.ClassUnavailable, true},
		{wrap(1040), idemstore.ClassUnavailable, false},
		{wrap(1290), idemstore.ClassUnavailable, false}, // read_only, super_read_only
		{wrap(1836), idemstore.ClassUnavailable, false},
		{wrap(1792), idemstore.ClassUnavailable, false},
		{wrap(1317), idemstore.ClassTransient, false},
		{errors.Join(errors.New("x"), driver.ErrBadConn), idemstore.ClassUnavailable, true},
		{fmt.Errorf("committing: %w", errors.New("invalid connection")), idemstore.ClassUnavailable, true},
		{errors.New("a handler's own error"), idemstore.ClassTransient, false},
	} {
		if got := MySQL.classify(c.err); got != c.class {
			t.Errorf("classify(%v) = %v, want %v", c.err, got, c.class)
		}
		if got := MySQL.commitUnknown(c.err); got != c.unknown {
			t.Errorf("commitUnknown(%v) = %v, want %v", c.err, got, c.unknown)
		}
	}
}

// mariadbOnly are constructs MariaDB accepts and MySQL 8.0 refuses (or,
// for the last ones, MySQL 8.0 before 8.0.29 and 8.0.x refuse: IF [NOT]
// EXISTS on indexes and columns).
var mariadbOnly = []string{"RETURNING", "SET STATEMENT", "CREATE OR REPLACE", "SEQUENCE",
	"INDEX IF NOT EXISTS", "INDEX IF EXISTS", "COLUMN IF NOT EXISTS", "COLUMN IF EXISTS", "INSERT IGNORE"}

// TestMySQLStatementsAreMySQL8: no statement of the MySQL dialect, nor its
// DDL script, uses MariaDB's syntax, so that what runs on MariaDB in the
// tests (which run the MySQL dialect there too) is what MySQL 8.0 accepts.
// The MariaDB dialect does use some, which this test sees, so that it can
// fail.
func TestMySQLStatementsAreMySQL8(t *testing.T) {
	tab := inboxdb.Table{Name: "idem_inbox"}
	texts := func(d Dialect) map[string]string {
		out := map[string]string{}
		st := d.statements(tab)
		v := reflect.ValueOf(st).Elem()
		for i := range v.NumField() {
			f, name := v.Field(i), v.Type().Field(i).Name
			if !v.Type().Field(i).IsExported() {
				continue
			}
			switch x := f.Interface().(type) {
			case string:
				out[name] = x
			case []string:
				out[name] = strings.Join(x, ";\n")
			case inboxdb.List:
				out[name] = x.Build(3)
			}
		}
		out["MySQLClaimed"] = inboxdb.MySQLClaimed(tab).Build(3)
		out["MySQLExtend"] = inboxdb.MySQLExtend(st, 3)
		out["pruneDelete"] = mysqlPruneDelete(tab, 3)
		sc, err := st.Script(14*24*time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		out["Script"] = sc.UpSQL() + sc.DownSQL()
		return out
	}
	for name, q := range texts(MySQL) {
		for _, bad := range mariadbOnly {
			if strings.Contains(strings.ToUpper(q), bad) {
				t.Errorf("MySQL dialect's %s uses MariaDB's %s:\n%s", name, bad, q)
			}
		}
	}
	if q := texts(MariaDB)["PruneBatch"]; !strings.Contains(q, "RETURNING") {
		t.Errorf("MariaDB's prune batch %q has no RETURNING: the check above would not see one", q)
	}
}

// mysqlDB opens a database of t's own on the test server with the session
// options mysqlinbox.Open sets (which this package's tests cannot import).
func mysqlDB(t *testing.T) *sql.DB {
	t.Helper()
	cfg := mysqltest.Database(t, "idem_t_")
	cfg.ParseTime, cfg.Loc = true, time.UTC
	cfg.Params = map[string]string{"sql_mode": "CONCAT(@@sql_mode, ',ANSI_QUOTES')", "time_zone": "'+00:00'"}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestMySQLPruneLocksNoGap: while a prune batch holds its rows (between its
// scan and its COMMIT), a claim whose keep_until falls past the last
// expired marker (here: every marker expired, as after a pause longer than
// the window, so the gap is the end of the keep_until index) inserts
// without waiting. At REPEATABLE READ the batch's locking scan would lock
// that gap and the claim would time out on it (1205). Both dialects, each
// prune's own statements.
func TestMySQLPruneLocksNoGap(t *testing.T) {
	ctx := context.Background()
	var version string
	if err := mysqlDB(t).QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	dialects := []Dialect{MySQL}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		dialects = append(dialects, MariaDB)
	}
	for _, d := range dialects {
		t.Run(d.Name(), func(t *testing.T) {
			db := mysqlDB(t)
			s, err := New(db, d, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			claimKeys := func(lock time.Duration, keys ...string) error {
				tx, err := s.Begin(ctx)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				cs := make([]idemstore.Claim, len(keys))
				for i, k := range keys {
					cs[i] = idemstore.Claim{Key: k, MessageID: "m-" + k}
				}
				if _, err := s.Claim(ctx, tx, "c", cs, lock); err != nil {
					return err
				}
				return tx.Commit()
			}
			if err := claimKeys(0, "a", "b", "c"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `UPDATE idem_inbox SET keep_until = UTC_TIMESTAMP(6) - INTERVAL 30 DAY, processed_at = UTC_TIMESTAMP(6) - INTERVAL 30 DAY`); err != nil {
				t.Fatal(err)
			}
			held, release := make(chan struct{}), make(chan struct{})
			mysqlPruneLocked = func() {
				close(held)
				<-release
			}
			t.Cleanup(func() { mysqlPruneLocked = nil })
			type pruned struct {
				res retention.Result
				err error
			}
			done := make(chan pruned, 1)
			go func() {
				// A batch larger than the expired markers: the scan reads on
				// to the end of the index.
				res, err := s.Prune(ctx, retention.Options{BatchSize: 100})
				done <- pruned{res, err}
			}()
			select {
			case <-held:
			case p := <-done:
				t.Fatalf("the prune ended without holding a batch: %+v %v", p.res, p.err)
			}
			err = claimKeys(time.Second, "z")
			close(release)
			if err != nil {
				t.Errorf("claim while a prune batch holds its rows: %v (class %v), want it inserted without waiting on the batch", err, s.Classify(err))
			}
			p := <-done
			if p.err != nil || p.res.Markers != 3 {
				t.Fatalf("prune: %+v %v, want the 3 expired markers", p.res, p.err)
			}
			var n int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox WHERE "key" = 'z'`).Scan(&n); err != nil || n != 1 {
				t.Errorf("marker z: %d (%v), want it kept", n, err)
			}
		})
	}
}

// TestMySQLPruneChunks: a MySQL prune batch larger than mysqlPruneChunk
// deletes its keys in several DELETEs, every one of them.
func TestMySQLPruneChunks(t *testing.T) {
	ctx := context.Background()
	db := mysqlDB(t)
	s, err := New(db, MySQL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	n := 2*mysqlPruneChunk + 500
	cs := make([]idemstore.Claim, n)
	for i := range cs {
		k := fmt.Sprintf("k-%05d", i)
		cs[i] = idemstore.Claim{Key: k, MessageID: "m-" + k}
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, tx, "c", cs, 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE idem_inbox SET keep_until = UTC_TIMESTAMP(6) - INTERVAL 30 DAY, processed_at = UTC_TIMESTAMP(6) - INTERVAL 30 DAY`); err != nil {
		t.Fatal(err)
	}
	res, err := s.Prune(ctx, retention.Options{BatchSize: 2 * n})
	if err != nil || res.Markers != int64(n) || res.Batches != 1 {
		t.Fatalf("prune: %+v %v, want %d markers in one batch", res, err, n)
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d markers left (%v), want none", left, err)
	}
}
