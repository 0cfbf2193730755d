package outbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// migrationFS holds the numbered migration templates of each dialect
// (0001_outbox.sql, 0002_…). A released migration is never edited: a
// change is a new file.
//
//go:embed migrations
var migrationFS embed.FS

// migrations renders the dialect's templates for the outbox table, in
// version order; each element is one migration's statements.
func (c *core) migrations() ([][]string, error) {
	entries, err := fs.ReadDir(migrationFS, c.s.migrations)
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	t := c.table
	data := struct{ Table, Leases, Relays string }{t.Quoted(), t.Sibling(t.Name + "_leases"), t.Sibling(t.Name + "_relays")}
	funcs := template.FuncMap{"index": func(column string) string { return `"` + t.IndexName(column) + `"` }}
	var out [][]string
	for i, e := range entries { // ReadDir sorts by name: by version
		if want := fmt.Sprintf("%04d_", i+1); !strings.HasPrefix(e.Name(), want) {
			return nil, fmt.Errorf("migration %s: versions must run 0001, 0002… without gaps", e.Name())
		}
		src, err := fs.ReadFile(migrationFS, path.Join(c.s.migrations, e.Name()))
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(e.Name()).Option("missingkey=error").Funcs(funcs).Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("parsing migration %s: %w", e.Name(), err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, data); err != nil {
			return nil, fmt.Errorf("rendering migration %s: %w", e.Name(), err)
		}
		var stmts []string
		for stmt := range strings.SplitSeq(b.String(), ";\n") {
			var keep []string
			for line := range strings.Lines(stmt) {
				if !strings.HasPrefix(strings.TrimSpace(line), "--") {
					keep = append(keep, line)
				}
			}
			if s := strings.TrimSpace(strings.Join(keep, "")); s != "" {
				stmts = append(stmts, strings.TrimSuffix(s, ";"))
			}
		}
		out = append(out, stmts)
	}
	return out, nil
}

// MigrateReport says what Migrate did.
type MigrateReport struct {
	Table    string // the outbox table
	Created  bool   // the table was new
	From, To int    // schema versions before and after
	Shards   int    // the stored shard count
}

// Migrate creates the outbox table and its siblings, or brings them to
// the newest schema version, in one transaction serialized against other
// migrators; running it again is a no-op. A new table stores
// Config.Shards (DefaultShards when 0); an existing one keeps its count,
// and a different non-zero Config.Shards is refused.
func (c *core) migrateReport(ctx context.Context) (MigrateReport, error) {
	r, err := c.migrate(ctx)
	if err != nil {
		return r, fmt.Errorf("migrating outbox table %s: %w", c.table, err)
	}
	c.mu.Lock()
	c.shards = r.Shards
	c.mu.Unlock()
	return r, nil
}

func (c *core) migrate(ctx context.Context) (r MigrateReport, err error) {
	r.Table = c.table.String()
	ms, err := c.migrations()
	if err != nil {
		return r, err
	}
	tx, err := c.drv.BeginMigration(ctx)
	if err != nil {
		return r, fmt.Errorf("beginning migration: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if c.s.migrateLock != "" {
		if _, err := tx.Exec(ctx, c.s.migrateLock); err != nil {
			return r, fmt.Errorf("taking the migration lock: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, c.s.meta); err != nil {
		return r, fmt.Errorf("creating the meta table: %w", err)
	}
	found := true
	if err := tx.QueryRow(ctx, c.s.readMeta).Scan(&r.From, &r.Shards); err != nil {
		if !isNoRows(err) {
			return r, fmt.Errorf("reading the schema version: %w", err)
		}
		found = false
	}
	r.Created, r.To = !found, len(ms)
	if r.From > len(ms) {
		return r, fmt.Errorf("schema version %d is newer than this build knows (%d): upgrade idem", r.From, len(ms))
	}
	for i, m := range ms[r.From:] {
		for _, stmt := range m {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return r, fmt.Errorf("applying migration %d: %w", r.From+i+1, err)
			}
		}
	}
	switch {
	case !found:
		r.Shards = c.cfg.Shards
		if r.Shards == 0 {
			r.Shards = DefaultShards
		}
		if _, err := tx.Exec(ctx, c.s.insertMeta, len(ms), r.Shards); err != nil {
			return r, fmt.Errorf("recording the shard count: %w", err)
		}
		for shard := range r.Shards {
			if _, err := tx.Exec(ctx, c.s.insertLease, shard, c.s.timeArg(never)); err != nil {
				return r, fmt.Errorf("creating the shard leases: %w", err)
			}
		}
	case c.cfg.Shards != 0 && c.cfg.Shards != r.Shards:
		return r, fmt.Errorf("%w: the configured shard count %d differs from the %d stored with the table; leave Shards unset to use the stored one",
			idem.ErrConfig, c.cfg.Shards, r.Shards)
	case r.From < len(ms):
		if _, err := tx.Exec(ctx, c.s.updateMeta, len(ms)); err != nil {
			return r, fmt.Errorf("recording the schema version: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return r, fmt.Errorf("committing migration: %w", err)
	}
	return r, nil
}

// isNoRows reports the "no rows" error of pgx or database/sql.
func isNoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}
