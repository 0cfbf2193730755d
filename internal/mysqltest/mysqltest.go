// Package mysqltest gives each test its own database on the MySQL or
// MariaDB server named by IDEM_MYSQL_URL (MySQL has no schemas: databases
// are the namespace), as package pgtest gives each test a PostgreSQL
// schema.
package mysqltest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The driver logs what it meets on a connection ("[mysql] ... i/o
// timeout", "closing bad idle connection") to stderr, for the whole
// process; the same errors reach the caller, which the tests check. Tests
// that cut connections on purpose make dozens of such lines that look like
// failures in a passing run. So the lines are kept here, and a failed test
// prints those logged during its life (see watch).
func init() {
	_ = mysql.SetLogger(driverLog)
}

var driverLog = &lineLog{}

// lineLog keeps the driver's recent lines with their time.
type lineLog struct {
	mu    sync.Mutex
	lines []logLine
	seen  map[testing.TB]bool
}

type logLine struct {
	at   time.Time
	text string
}

// maxLines bounds what the log keeps: the oldest lines go first.
const maxLines = 2000

func (l *lineLog) Print(v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == maxLines {
		l.lines = append(l.lines[:0], l.lines[maxLines/2:]...)
	}
	l.lines = append(l.lines, logLine{time.Now(), fmt.Sprint(v...)})
}

// since returns the lines logged since start.
func (l *lineLog) since(start time.Time) []logLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logLine
	for _, line := range l.lines {
		if !line.at.Before(start) {
			out = append(out, line)
		}
	}
	return out
}

// watch makes the driver's lines logged from now until t ends part of t's
// log when t fails. The driver's log is the process's, so with tests in
// parallel the lines may come from another test's connections.
func watch(t testing.TB) {
	driverLog.mu.Lock()
	if driverLog.seen == nil {
		driverLog.seen = map[testing.TB]bool{}
	}
	first := !driverLog.seen[t]
	driverLog.seen[t] = true
	driverLog.mu.Unlock()
	if !first {
		return
	}
	start := time.Now()
	t.Cleanup(func() {
		driverLog.mu.Lock()
		delete(driverLog.seen, t)
		driverLog.mu.Unlock()
		if !t.Failed() {
			return
		}
		for _, line := range driverLog.since(start) {
			t.Logf("mysql driver at %s (a connection of this process, maybe another test's): %s", line.at.Format("15:04:05.000"), line.text)
		}
	})
}

// DefaultDSN is used when IDEM_MYSQL_URL is unset; scripts/services.sh
// starts that server.
const DefaultDSN = "root@tcp(127.0.0.1:3306)/test"

// ServerDSN returns IDEM_MYSQL_URL or DefaultDSN, and skips t when
// IDEM_MYSQL_URL is "skip". The MySQL driver's log lines of t's life go to
// t's log if t fails (see watch), not to stderr.
func ServerDSN(t testing.TB) string {
	t.Helper()
	watch(t)
	dsn := os.Getenv("IDEM_MYSQL_URL")
	if dsn == "skip" {
		t.Skip("IDEM_MYSQL_URL=skip: MySQL tests skipped")
	}
	if dsn == "" {
		dsn = DefaultDSN
	}
	return dsn
}

// Database creates a database of t's own, named prefix plus random hex,
// drops it when t ends, and returns the server's configuration with that
// database selected, for the caller to adjust and open.
func Database(t testing.TB, prefix string) *mysql.Config {
	t.Helper()
	cfg, err := mysql.ParseDSN(ServerDSN(t))
	if err != nil {
		t.Fatalf("IDEM_MYSQL_URL: %v", err)
	}
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := prefix + hex.EncodeToString(b[:])
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		_ = admin.Close()
		t.Fatalf("creating database %s (start MariaDB with scripts/services.sh, set IDEM_MYSQL_URL, or IDEM_MYSQL_URL=skip): %v", name, err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec("DROP DATABASE " + name)
		_ = admin.Close()
	})
	cfg.DBName = name
	return cfg
}
