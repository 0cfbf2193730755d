package inboxdb

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// The bookkeeping tables, created beside the inbox (in its schema) and
// shared by every inbox table there, keyed by the table's quoted name.
const (
	// migrationsTable: the schema version of each inbox table.
	migrationsTable = "idem_migrations"
	// settingsTable: each inbox's layout and retention window (DESIGN.md
	// 10), written by Migrate, changed only by SetWindow.
	settingsTable = "idem_inbox_settings"
	// horizonsTable: the horizon each consumer of an inbox last reported.
	horizonsTable = "idem_inbox_horizons"
	// prunedTable: summaries (Bloom filters) of the keys each prune deleted,
	// per consumer, so a message whose marker is gone can still be told.
	prunedTable = "idem_inbox_pruned"
)

// migrationFS holds one directory of numbered templates per dialect and
// layout (0001_inbox.sql, 0002_…). A migration is never edited once
// released: a change is a new file, so every database converges on the
// same schema. PostgreSQL's plain layout is the same for both stores.
//
//go:embed migrations
var migrationFS embed.FS

// migration is one numbered, rendered migration.
type migration struct {
	version    int
	name       string
	statements []string
}

// migrations renders d's templates for its table, in version order.
func (d *Dialect) migrationList() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, d.migrations)
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	t := d.Table
	data := struct{ Table, Name string }{Table: t.Quoted(), Name: quoteIdent(t.Name)}
	funcs := template.FuncMap{
		// An index is named after its table and column, within 63 bytes;
		// PostgreSQL puts it in its table's schema, so it is never
		// qualified.
		"index":   func(column string) string { return quoteIdent(t.IndexName(column)) },
		"sibling": func(suffix string) string { return t.Sibling(t.Name + suffix) },
		// qindex is an index's name qualified by its table's schema, for
		// DROP INDEX.
		"qindex": func(column string) string { return t.Sibling(t.IndexName(column)) },
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration file %s: want NNNN_name.sql", e.Name())
		}
		src, err := fs.ReadFile(migrationFS, path.Join(d.migrations, e.Name()))
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

// Migrate brings the inbox table to the newest schema version and records
// its settings, in one transaction serialized against other migrators: all
// pending migrations apply or none, and running it again is a no-op. It
// refuses a table of the other layout (PostgreSQL).
//
// The settings are written when the table has none: its layout, and window
// (DefaultWindow when 0). A table that has them keeps them: a different
// non-zero window is refused with both numbers and the command that changes
// the stored one, so that no process guards or prunes by a window of its
// own. It returns the stored settings, with the window processors may guard
// with now (see [Inbox.Settings]).
func (b *Inbox) Migrate(ctx context.Context) (idem.Settings, error) {
	s, _, err := b.MigrateReport(ctx)
	return s, err
}

// MigrateReport is [Inbox.Migrate] that also says what it did: whether it
// created the table, and the schema versions before and after.
func (b *Inbox) MigrateReport(ctx context.Context) (idem.Settings, idem.MigrateReport, error) {
	s, r, err := b.migrate(ctx)
	if err != nil {
		return s, r, fmt.Errorf("migrating inbox table %s: %w", b.D.Table, err)
	}
	return s, r, nil
}

func (b *Inbox) migrate(ctx context.Context) (set idem.Settings, rep idem.MigrateReport, err error) {
	d := b.D
	rep.Table = d.Table.String()
	ms, err := d.migrationList()
	if err != nil {
		return set, rep, err
	}
	tx, err := b.Driver.BeginMigration(ctx)
	if err != nil {
		return set, rep, fmt.Errorf("beginning migration: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, q := range d.Bookkeeping {
		if _, err := tx.Exec(ctx, q); err != nil {
			return set, rep, fmt.Errorf("creating the bookkeeping tables: %w", err)
		}
	}
	key := d.Table.Quoted()
	var current int
	if err := tx.QueryRow(ctx, d.ReadVersion, key).Scan(&current); err != nil && !isNoRows(err) {
		return set, rep, fmt.Errorf("reading schema version: %w", err)
	}
	existed, err := d.tableExists(ctx, tx)
	if err != nil {
		return set, rep, fmt.Errorf("looking for the table: %w", err)
	}
	rep.Created, rep.From, rep.To = !existed, current, len(ms)
	if current > len(ms) {
		return set, rep, fmt.Errorf("schema version %d is newer than this build knows (%d): upgrade idem", current, len(ms))
	}
	for _, m := range ms[current:] {
		for _, stmt := range m.statements {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return set, rep, fmt.Errorf("applying %s: %w", m.name, err)
			}
		}
	}
	if d.Relkind != "" {
		// CREATE TABLE IF NOT EXISTS keeps a table of the other layout;
		// using it would either fail every claim or, worse, not
		// deduplicate as configured.
		var kind string
		if err := tx.QueryRow(ctx, d.Relkind, key).Scan(&kind); err != nil {
			return set, rep, fmt.Errorf("checking inbox layout: %w", err)
		}
		want := map[idem.Layout]string{idem.LayoutPlain: "r", idem.LayoutPartitioned: "p"}[d.Layout]
		if kind != want {
			return set, rep, fmt.Errorf("%w: table %s exists with relkind %q, not the %s layout; use another table name for the %s layout",
				idem.ErrConfig, d.Table, kind, d.Layout, d.Layout)
		}
	}
	if current < len(ms) {
		if _, err := tx.Exec(ctx, d.WriteVersion, key, len(ms)); err != nil {
			return set, rep, fmt.Errorf("recording schema version: %w", err)
		}
	}
	st, found, err := b.readSettings(ctx, tx)
	if err != nil {
		return set, rep, err
	}
	switch {
	case !found:
		set = idem.Settings{Layout: d.Layout, Window: b.Window}
		if set.Window == 0 {
			set.Window = DefaultWindow
		}
		rep.Layout, rep.Window = set.Layout, set.Window
		if _, err := tx.Exec(ctx, d.InsertSettings, key, set.Layout.String(), set.Window.Milliseconds()); err != nil {
			return set, rep, fmt.Errorf("recording the inbox settings: %w", err)
		}
	case st.Layout != d.Layout:
		return set, rep, fmt.Errorf("%w: table %s is recorded with the %s layout, not %s", idem.ErrConfig, d.Table, st.Layout, d.Layout)
	case b.Window != 0 && b.Window != st.Window:
		return set, rep, fmt.Errorf("%w: the configured window %v differs from the window stored with table %s, %v; "+
			"leave the window unset to use the stored one, or change it for every consumer with: idem inbox window set %v --table %s",
			idem.ErrConfig, b.Window, d.Table, st.Window, b.Window, d.Table)
	default:
		set = idem.Settings{Layout: st.Layout, Window: st.Guard}
		rep.Layout, rep.Window = st.Layout, st.Window
	}
	if err := tx.Commit(ctx); err != nil {
		return set, rep, fmt.Errorf("committing migration: %w", err)
	}
	return set, rep, nil
}

// isNoRows reports the "no rows" error of pgx or database/sql.
func isNoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}
