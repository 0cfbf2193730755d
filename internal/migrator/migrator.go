// Package migrator is the mechanics every idem table is migrated with: one
// version table (idem_migrations, beside the tables it records), one lock per
// engine, one transaction on one connection, and numbered migrations rendered
// from the SQL files each feature keeps beside its code. A feature describes
// its table as a [Component]; [Run] applies any number of them together.
//
// The lock is the caller's transaction's: on PostgreSQL [Run] takes
// pg_advisory_xact_lock itself, first; on MySQL and MariaDB the transaction
// must be begun on a session holding GET_LOCK, and on SQLite with BEGIN
// IMMEDIATE (the stores' BeginMigration do both).
package migrator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

// Engine is a database: "postgres", "mysql" (MySQL 8.0 and MariaDB) or
// "sqlite".
type Engine string

// The engines.
const (
	Postgres Engine = "postgres"
	MySQL    Engine = "mysql"
	SQLite   Engine = "sqlite"
)

// VersionTable is the name of the one version table, created beside the
// tables it records (in their schema).
const VersionTable = "idem_migrations"

// PostgresLock is taken first in every PostgreSQL migration transaction, by
// every idem migrator: one key for every table, since the version table is
// shared and CREATE TABLE IF NOT EXISTS is not safe against a concurrent
// creator.
const PostgresLock = `SELECT pg_advisory_xact_lock(hashtext('idem.migrate'))`

// Row is one result row: pgx.Row and *sql.Row both are.
type Row interface{ Scan(dest ...any) error }

// Conn runs statements inside the migration transaction.
type Conn interface {
	// Exec runs a statement and returns the rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// QueryRow runs a statement that returns one row.
	QueryRow(ctx context.Context, sql string, args ...any) Row
	// Query runs a statement and calls each with every row it returns.
	Query(ctx context.Context, sql string, each func(Row) error, args ...any) error
}

// Tx is the migration transaction.
type Tx interface {
	Conn
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Migration is one numbered migration, rendered.
type Migration struct {
	Version    int
	Name       string // the file's name
	Statements []string
}

// Load renders the templates NNNN_name.sql of dir in fsys with data and
// funcs, in version order. Versions must run 1, 2, 3… without gaps; a
// released file is never edited, a change is a new file.
func Load(fsys fs.FS, dir string, data any, funcs template.FuncMap) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration file %s: want NNNN_name.sql", e.Name())
		}
		src, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", e.Name(), err)
		}
		tmpl, err := template.New(e.Name()).Option("missingkey=error").Funcs(funcs).Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("parsing migration %s: %w", e.Name(), err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, data); err != nil {
			return nil, fmt.Errorf("rendering migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), Statements: Split(b.String())})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: versions must run 1, 2, 3… without gaps", m.Name)
		}
	}
	return out, nil
}

// Split cuts a script at semicolons that end a line, so each statement is
// sent alone: not every driver accepts several per Exec. Migration files
// keep semicolons out of the middle of lines for this reason. Comment lines
// are dropped.
func Split(script string) []string {
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

// Component is one idem table (with its siblings) as the migrator sees it.
type Component struct {
	// Name is the component's name: "inbox", "outbox", "idemkey", "dlq".
	Name string
	// Table is the table's name as the user wrote it, for messages.
	Table string
	// Key is the table's quoted name: it keys the component's row in the
	// version table.
	Key string
	// Book is the quoted version table beside the table.
	Book string
	// Migrations are the component's migrations, rendered for its table.
	Migrations []Migration
	// Setup, when set, runs first: it creates what the component keeps
	// beside its versions (settings tables), idempotently.
	Setup func(ctx context.Context, c Conn) error
	// Adopt, when set, is the version the component recorded its own way
	// before the version table recorded it (0: none), read when the version
	// table has no row for Key: that version is taken as applied.
	Adopt func(ctx context.Context, c Conn) (int, error)
	// Check, when set, refuses a table the migrations must not touch,
	// before any is applied; from is the recorded version.
	Check func(ctx context.Context, c Conn, from int) error
	// Drop removes what the migrations create, for an exported down
	// script; the version row is removed besides.
	Drop []string
	// After, when set, runs once the migrations are applied and the
	// version recorded: the component's settings.
	After func(ctx context.Context, c Conn, from, to int) error
}

// Result is what [Run] did to one component.
type Result struct {
	Component, Table string
	// From and To are the schema versions before and after.
	From, To int
	// Adopted is set when From was read from the component's own record
	// (see [Component.Adopt]) and is now in the version table.
	Adopted bool
}

// Applied reports whether any migration ran.
func (r Result) Applied() bool { return r.From < r.To }

// VersionTableDDL creates the version table book (quoted) on e.
func VersionTableDDL(e Engine, book string) string {
	switch e {
	case MySQL:
		return `CREATE TABLE IF NOT EXISTS ` + book + ` (
    table_name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    version    INT NOT NULL,
    applied_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE=InnoDB`
	case SQLite:
		return `CREATE TABLE IF NOT EXISTS ` + book + ` (
    table_name text PRIMARY KEY,
    version    integer NOT NULL,
    applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))
)`
	}
	return `CREATE TABLE IF NOT EXISTS ` + book + ` (
    table_name text PRIMARY KEY,
    version    int  NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
}

// ReadVersionSQL reads the version of $1 (a table's quoted name) from book.
func ReadVersionSQL(e Engine, book string) string {
	return `SELECT version FROM ` + book + ` WHERE table_name = ` + param(e, 1)
}

// WriteVersionSQL records $2 as the version of $1 in book; the version only
// grows.
func WriteVersionSQL(e Engine, book string) string {
	switch e {
	case MySQL:
		return `INSERT INTO ` + book + ` (table_name, version) VALUES (?, ?)
ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version)), applied_at = UTC_TIMESTAMP(6)`
	case SQLite:
		return `INSERT INTO ` + book + ` (table_name, version) VALUES (?1, ?2)
ON CONFLICT (table_name) DO UPDATE SET version = max(version, excluded.version), applied_at = excluded.applied_at`
	}
	return `INSERT INTO ` + book + ` AS m (table_name, version) VALUES ($1, $2)
ON CONFLICT (table_name) DO UPDATE SET version = greatest(m.version, excluded.version), applied_at = now()`
}

func param(e Engine, n int) string {
	switch e {
	case MySQL:
		return "?"
	case SQLite:
		return "?" + strconv.Itoa(n)
	}
	return "$" + strconv.Itoa(n)
}

// Run migrates comps, in order, inside tx: on PostgreSQL it first takes the
// migration lock (the other engines' lock comes with tx, see the package
// documentation). It neither commits nor rolls back: all of comps apply or
// none, as the caller decides.
func Run(ctx context.Context, tx Conn, e Engine, comps ...*Component) ([]Result, error) {
	out := make([]Result, 0, len(comps))
	for _, c := range comps {
		r, err := Apply(ctx, tx, e, c)
		if err != nil {
			return out, fmt.Errorf("migrating %s table %s: %w", c.Name, c.Table, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// Apply is [Run] of one component, whose errors do not name it: for a
// feature's own Migrate, which names its table its own way.
func Apply(ctx context.Context, tx Conn, e Engine, c *Component) (Result, error) {
	if e == Postgres {
		// Taken again by the same transaction, the lock is not waited for.
		if _, err := tx.Exec(ctx, PostgresLock); err != nil {
			return Result{}, fmt.Errorf("taking the migration lock: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, VersionTableDDL(e, c.Book)); err != nil {
		return Result{}, fmt.Errorf("creating the version table %s: %w", c.Book, err)
	}
	return runOne(ctx, tx, e, c)
}

// Versions reads each component's recorded version, or the version it
// would adopt, into Result.From, without applying anything; Result.To is the
// newest. The caller rolls tx back (it may have created the version table).
func Versions(ctx context.Context, tx Conn, e Engine, comps ...*Component) ([]Result, error) {
	var out []Result
	for _, c := range comps {
		if e == Postgres {
			if _, err := tx.Exec(ctx, PostgresLock); err != nil {
				return out, fmt.Errorf("taking the migration lock: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, VersionTableDDL(e, c.Book)); err != nil {
			return out, fmt.Errorf("creating the version table %s: %w", c.Book, err)
		}
		if c.Setup != nil {
			if err := c.Setup(ctx, tx); err != nil {
				return out, fmt.Errorf("reading %s table %s: %w", c.Name, c.Table, err)
			}
		}
		r, _, err := version(ctx, tx, e, c)
		if err != nil {
			return out, fmt.Errorf("reading %s table %s: %w", c.Name, c.Table, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// version reads c's version, adopting what c recorded its own way when the
// version table has none; found says the version table had it.
func version(ctx context.Context, tx Conn, e Engine, c *Component) (r Result, found bool, err error) {
	r = Result{Component: c.Name, Table: c.Table, To: len(c.Migrations)}
	found = true
	if err := tx.QueryRow(ctx, ReadVersionSQL(e, c.Book), c.Key).Scan(&r.From); err != nil {
		if !isNoRows(err) {
			return r, false, fmt.Errorf("reading the schema version: %w", err)
		}
		found = false
	}
	if !found && c.Adopt != nil {
		v, err := c.Adopt(ctx, tx)
		if err != nil {
			return r, false, fmt.Errorf("reading the schema version recorded before %s: %w", VersionTable, err)
		}
		r.From, r.Adopted = v, v > 0
	}
	return r, found, nil
}

func runOne(ctx context.Context, tx Conn, e Engine, c *Component) (Result, error) {
	if c.Setup != nil {
		if err := c.Setup(ctx, tx); err != nil {
			return Result{}, err
		}
	}
	r, found, err := version(ctx, tx, e, c)
	if err != nil {
		return r, err
	}
	if r.From > r.To {
		return r, fmt.Errorf("schema version %d is newer than this build knows (%d): upgrade idem", r.From, r.To)
	}
	if c.Check != nil {
		if err := c.Check(ctx, tx, r.From); err != nil {
			return r, err
		}
	}
	for _, m := range c.Migrations[r.From:] {
		for _, stmt := range m.Statements {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return r, fmt.Errorf("applying %s: %w", m.Name, err)
			}
		}
	}
	if r.From < r.To || !found {
		if _, err := tx.Exec(ctx, WriteVersionSQL(e, c.Book), c.Key, r.To); err != nil {
			return r, fmt.Errorf("recording the schema version: %w", err)
		}
	}
	if c.After != nil {
		if err := c.After(ctx, tx, r.From, r.To); err != nil {
			return r, err
		}
	}
	return r, nil
}

// isNoRows reports the "no rows" error of pgx or database/sql.
func isNoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}
