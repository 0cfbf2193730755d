package sqlinbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

// migrationFS holds one directory of numbered templates per dialect
// (0001_inbox.sql, 0002_…). A migration is never edited once released: a
// change is a new file, so every database converges on the same schema.
//
//go:embed migrations
var migrationFS embed.FS

// migrationsTable is the bookkeeping table, created next to the inbox (in the
// same schema): one row per inbox table, keyed by its quoted name, with the
// last version applied. pgxinbox keeps the same table with the same keys, so
// a user can switch between the two stores on PostgreSQL.
const migrationsTable = "idem_migrations"

var errBadConn = driver.ErrBadConn

// querier is what a migration runs statements on: a *sql.Tx or, on SQLite,
// a *sql.Conn inside BEGIN IMMEDIATE.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// migrationTx is the transaction all pending migrations run in.
type migrationTx struct {
	q        querier
	commit   func() error
	rollback func() error
}

// migration is one numbered, rendered migration.
type migration struct {
	version    int
	name       string
	statements []string
}

// migrations renders the dialect's templates for table t, in version order.
func migrations(d Dialect, t tableName) ([]migration, error) {
	dir := path.Join("migrations", d.migrationDir())
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	data := struct{ Table, Index string }{Table: t.quoted(), Index: quoteIdent(t.indexName())}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration file %s: want NNNN_name.sql", e.Name())
		}
		src, err := fs.ReadFile(migrationFS, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", e.Name(), err)
		}
		tmpl, err := template.New(e.Name()).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("parsing migration %s: %w", e.Name(), err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, data); err != nil {
			return nil, fmt.Errorf("rendering migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{version: v, name: e.Name(), statements: splitStatements(b.String())})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: versions must run 1, 2, 3… without gaps", m.name)
		}
	}
	return out, nil
}

// splitStatements cuts a script at semicolons that end a line, so each
// statement is sent alone: not every driver accepts several per Exec. The
// templates keep semicolons out of the middle of lines for this reason.
func splitStatements(script string) []string {
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

// Migrate creates or upgrades the inbox table to the latest schema version.
// All pending migrations apply in one transaction, so a failure leaves the
// previous version intact. Concurrent migrators are serialized (an advisory
// lock on PostgreSQL, BEGIN IMMEDIATE on SQLite); running Migrate again is a
// no-op.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.migrate(ctx); err != nil {
		return fmt.Errorf("migrating inbox table %s: %w", s.table, err)
	}
	return nil
}

func (s *Store) migrate(ctx context.Context) (err error) {
	ms, err := migrations(s.dialect, s.table)
	if err != nil {
		return err
	}
	tx, err := s.dialect.beginMigration(ctx, s.db)
	if err != nil {
		return fmt.Errorf("beginning migration: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.rollback()
		}
	}()
	book := s.table.qualify(migrationsTable)
	if _, err := tx.q.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+book+` (
	table_name text PRIMARY KEY,
	version    integer NOT NULL,
	applied_at `+s.dialect.nowColumn()+`
)`); err != nil {
		return fmt.Errorf("creating %s: %w", migrationsTable, err)
	}
	var current int
	err = tx.q.QueryRowContext(ctx, `SELECT version FROM `+book+` WHERE table_name = `+s.dialect.placeholder(1), s.table.quoted()).Scan(&current)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		current = 0
	case err != nil:
		return fmt.Errorf("reading schema version: %w", err)
	}
	if current > len(ms) {
		return fmt.Errorf("schema version %d is newer than this build knows (%d): upgrade idem", current, len(ms))
	}
	for _, m := range ms[current:] {
		for _, stmt := range m.statements {
			if _, err := tx.q.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("applying %s: %w", m.name, err)
			}
		}
	}
	if current == len(ms) {
		return nil // up to date: the deferred rollback releases the lock
	}
	p1, p2 := s.dialect.placeholder(1), s.dialect.placeholder(2)
	if _, err := tx.q.ExecContext(ctx, `INSERT INTO `+book+` (table_name, version) VALUES (`+p1+`, `+p2+`)
ON CONFLICT (table_name) DO UPDATE SET version = excluded.version, applied_at = excluded.applied_at`, s.table.quoted(), len(ms)); err != nil {
		return fmt.Errorf("recording schema version: %w", err)
	}
	committed = true
	if err := tx.commit(); err != nil {
		return fmt.Errorf("committing migration: %w", err)
	}
	return nil
}
