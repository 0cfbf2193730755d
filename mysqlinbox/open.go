// Package mysqlinbox opens a MySQL or MariaDB database for an idem inbox:
// the driver (github.com/go-sql-driver/mysql), with the session options the
// store needs, and the MySQL dialect of package sqlinbox. It is a package of
// its own so that other users of sqlinbox do not link the MySQL driver.
//
//	db, err := mysqlinbox.Open("app:secret@tcp(db:3306)/billing")
//	...
//	store, err := mysqlinbox.New(db, &sqlinbox.Config{})
//
// Only the plain layout exists on MySQL: a partitioned table there needs
// the partition key in every unique key, which the inbox's primary key
// (consumer, key) cannot carry without losing its meaning, and dropping a
// partition takes a metadata lock on the whole table.
package mysqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlinbox"
)

// Dialect is the MySQL dialect of package sqlinbox, which works on MySQL
// and MariaDB alike; [New] picks sqlinbox.MariaDB on MariaDB.
var Dialect = sqlinbox.MySQL

// New returns a sqlinbox store on db, a database opened with [Open], with
// the dialect [Detect] finds: sqlinbox.New(db, dialect, cfg). Unlike
// sqlinbox.New it asks the server its version, once.
func New(db *sql.DB, cfg *sqlinbox.Config) (*sqlinbox.Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Detect(ctx, db)
	if err != nil {
		return nil, err
	}
	return sqlinbox.New(db, d, cfg)
}

// Detect returns sqlinbox.MariaDB when the server says it is MariaDB (its
// VERSION() ends so), sqlinbox.MySQL otherwise.
func Detect(ctx context.Context, db *sql.DB) (sqlinbox.Dialect, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: mysqlinbox: db is nil", idem.ErrConfig)
	}
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return nil, fmt.Errorf("mysqlinbox: asking the server its version: %w", err)
	}
	if strings.Contains(strings.ToLower(v), "mariadb") {
		return sqlinbox.MariaDB, nil
	}
	return sqlinbox.MySQL, nil
}

// Config returns dsn parsed, with the options the store needs set:
//
//   - parseTime and loc UTC: DATETIME columns scan as UTC time.Time.
//   - interpolateParams false: arguments travel as prepared-statement
//     parameters, never spliced into the SQL text.
//   - sql_mode with ANSI_QUOTES added to the server's: idem's statements
//     quote identifiers with double quotes, as on PostgreSQL and SQLite.
//   - time_zone '+00:00': the server's NOW() agrees with the UTC the store
//     writes (the store itself uses UTC_TIMESTAMP).
//   - rejectReadOnly: a failed-over primary turned read-only drops the
//     connection instead of failing every write.
func Config(dsn string) (*mysql.Config, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: mysqlinbox: %w", idem.ErrConfig, err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = false
	cfg.RejectReadOnly = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["sql_mode"] = "CONCAT(@@sql_mode, ',ANSI_QUOTES')"
	cfg.Params["time_zone"] = "'+00:00'"
	return cfg, nil
}

// Open opens the database at dsn (the driver's format,
// user:password@tcp(host:3306)/database) with the options of [Config], and
// checks that it answers. The caller closes the returned *sql.DB.
func Open(dsn string) (*sql.DB, error) {
	cfg, err := Config(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: mysqlinbox: %w", idem.ErrConfig, err)
	}
	db := sql.OpenDB(conn)
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("opening MySQL %s@%s/%s: %w", cfg.User, cfg.Addr, cfg.DBName, err)
	}
	return db, nil
}
