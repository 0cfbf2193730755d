package sqlinbox

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/inboxdb"
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
		class   idem.ErrorClass
		unknown bool // as a COMMIT's error
	}{
		{wrap(1213), idem.ClassBusy, false},
		{wrap(1205), idem.ClassBusy, false},
		{wrap(1062), idem.ClassPermanent, false},
		{wrap(1146), idem.ClassConfig, false},
		{wrap(1045), idem.ClassConfig, false},
		{wrap(2006), idem.ClassUnavailable, true},
		{wrap(2013), idem.ClassUnavailable, true},
		{wrap(1040), idem.ClassUnavailable, false},
		{wrap(1290), idem.ClassUnavailable, false}, // read_only, super_read_only
		{wrap(1836), idem.ClassUnavailable, false},
		{wrap(1792), idem.ClassUnavailable, false},
		{wrap(1317), idem.ClassTransient, false},
		{errors.Join(errors.New("x"), driver.ErrBadConn), idem.ClassUnavailable, true},
		{fmt.Errorf("committing: %w", errors.New("invalid connection")), idem.ClassUnavailable, true},
		{errors.New("a handler's own error"), idem.ClassTransient, false},
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
