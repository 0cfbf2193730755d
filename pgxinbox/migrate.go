package pgxinbox

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

//go:embed migrations/*.sql migrations/partitioned/*.sql
var migrationFS embed.FS

// migrationDir holds the migrations of a layout. The layouts have separate
// histories: a table is created in one layout and stays in it.
func (s *Store) migrationDir() string {
	if s.layout == Partitioned {
		return "migrations/partitioned"
	}
	return "migrations"
}

// migration is one versioned schema change, rendered for a table name.
type migration struct {
	version int
	name    string
	sql     string
}

func (s *Store) migrations() ([]migration, error) {
	dir := s.migrationDir()
	all, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return nil, err
	}
	entries := all[:0:0]
	for _, e := range all {
		if !e.IsDir() {
			entries = append(entries, e)
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	data := map[string]string{"Table": s.name}
	funcs := template.FuncMap{
		// index names an index after the table; PostgreSQL puts an index in
		// its table's schema, so the name is never qualified.
		"index": func(suffix string) string {
			return pgx.Identifier{s.table[len(s.table)-1] + "_" + suffix + "_idx"}.Sanitize()
		},
	}
	out := make([]migration, 0, len(entries))
	for _, e := range entries {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s has no version prefix", e.Name())
		}
		raw, err := migrationFS.ReadFile(dir + "/" + e.Name())
		if err != nil {
			return nil, err
		}
		t, err := template.New(e.Name()).Funcs(funcs).Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("parsing migration %s: %w", e.Name(), err)
		}
		var b bytes.Buffer
		if err := t.Execute(&b, data); err != nil {
			return nil, fmt.Errorf("rendering migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{version: v, name: e.Name(), sql: b.String()})
	}
	return out, nil
}

// Migrate brings the inbox table up to the newest schema version. It is safe
// to call on every start and from several processes at once: migrators queue
// on an advisory lock, and each version is applied once, recorded in
// idem_migrations next to the inbox table. It refuses a table that exists in
// the other layout. For the partitioned layout it then creates the daily
// partitions of the whole window and of the next days (see
// [Store.EnsurePartitions]), so the first claims find a partition.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.migrate(ctx); err != nil {
		return err
	}
	if s.layout != Partitioned {
		return nil
	}
	now, err := s.now(ctx)
	if err != nil {
		return fmt.Errorf("migrating inbox: %w", err)
	}
	days := int(s.window/day) + 1 + DefaultDaysAhead
	if _, err := s.EnsurePartitions(ctx, now.Add(-s.window), days); err != nil {
		return fmt.Errorf("migrating inbox: %w", err)
	}
	return nil
}

func (s *Store) migrate(ctx context.Context) error {
	ms, err := s.migrations()
	if err != nil {
		return err
	}
	bookkeeping := "idem_migrations"
	if len(s.table) == 2 {
		bookkeeping = pgx.Identifier{s.table[0], bookkeeping}.Sanitize()
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrating inbox: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	steps := []string{
		`SELECT pg_advisory_xact_lock(hashtext('idem.migrate'))`,
		`CREATE TABLE IF NOT EXISTS ` + bookkeeping + ` (
    table_name text PRIMARY KEY,
    version    int  NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
	}
	for _, q := range steps {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("migrating inbox: %w", err)
		}
	}
	var current int
	err = tx.QueryRow(ctx, `SELECT version FROM `+bookkeeping+` WHERE table_name = $1`, s.name).Scan(&current)
	if err != nil && err != pgx.ErrNoRows {
		return fmt.Errorf("reading inbox schema version: %w", err)
	}
	for _, m := range ms {
		if m.version <= current {
			continue
		}
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("applying migration %s: %w", m.name, err)
		}
		current = m.version
	}
	// CREATE TABLE IF NOT EXISTS keeps a table of the other layout; using it
	// would either fail every claim or, worse, not deduplicate as configured.
	var kind string
	if err := tx.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, s.name).Scan(&kind); err != nil {
		return fmt.Errorf("checking inbox layout: %w", err)
	}
	if got := map[string]Layout{"r": Plain, "p": Partitioned}[kind]; got != s.layout || (kind != "r" && kind != "p") {
		return fmt.Errorf("%w: pgxinbox: table %s exists with relkind %q, not the %s layout; use another table name for the %s layout",
			idem.ErrConfig, s.name, kind, s.layout, s.layout)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+bookkeeping+` (table_name, version) VALUES ($1, $2)
ON CONFLICT (table_name) DO UPDATE SET version = EXCLUDED.version, applied_at = now()`, s.name, current); err != nil {
		return fmt.Errorf("recording inbox schema version: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrating inbox: %w", err)
	}
	return nil
}
