// Package mysqltest gives each test its own database on the MySQL or
// MariaDB server named by IDEM_MYSQL_URL (MySQL has no schemas: databases
// are the namespace), as package pgtest gives each test a PostgreSQL
// schema.
package mysqltest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// DefaultDSN is used when IDEM_MYSQL_URL is unset; scripts/services.sh
// starts that server.
const DefaultDSN = "root@tcp(127.0.0.1:3306)/test"

// ServerDSN returns IDEM_MYSQL_URL or DefaultDSN, and skips t when
// IDEM_MYSQL_URL is "skip".
func ServerDSN(t testing.TB) string {
	t.Helper()
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
