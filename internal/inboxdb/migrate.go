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
// pending migrations apply or none, and running it again is a no-op.
// Before applying anything it refuses an existing table it would not make
// the store's inbox: one without the columns every inbox version had
// ([NotInboxError]) or, on PostgreSQL, of the other layout ([LayoutError]);
// both match [idem.ErrConfig].
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
	defer rollback(ctx, tx)
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
	if existed {
		// CREATE TABLE IF NOT EXISTS keeps a table of another shape or
		// layout; the migrations after it would fail on it with the
		// database's words, or worse, succeed.
		cat, err := d.readCatalog(ctx, tx)
		if err != nil {
			return set, rep, fmt.Errorf("reading the catalog: %w", err)
		}
		if err := d.checkShape(cat); err != nil {
			return set, rep, err
		}
	}
	for _, m := range ms[current:] {
		for _, stmt := range m.statements {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return set, rep, fmt.Errorf("applying %s: %w", m.name, err)
			}
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
		return set, rep, &LayoutError{Table: d.Table.String(), Has: st.Layout, Want: d.Layout}
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

// firstColumns are the columns of the first schema version of every
// dialect and layout (migrations/*/0001_inbox.sql): every idem inbox has
// had them. A table without one of them is not an inbox of any version.
var firstColumns = []string{"consumer", "key", "message_id", "body_sha256", "event_time", "processed_at"}

// missingFirstColumns is the columns of [firstColumns] that cat's table
// lacks.
func (cat catalog) missingFirstColumns() []string {
	var missing []string
	for _, c := range firstColumns {
		if _, ok := cat.columns[c]; !ok {
			missing = append(missing, c)
		}
	}
	return missing
}

// layoutOf is the layout of a PostgreSQL relkind; ok is false for a
// relation that is not a table (a view, a materialized or foreign table).
func layoutOf(relkind string) (l idem.Layout, ok bool) {
	switch relkind {
	case "r":
		return idem.LayoutPlain, true
	case "p":
		return idem.LayoutPartitioned, true
	}
	return l, false
}

// relationKinds names the PostgreSQL relkinds that are not tables.
var relationKinds = map[string]string{"v": "a view", "m": "a materialized view", "f": "a foreign table", "S": "a sequence", "i": "an index", "c": "a composite type"}

// checkShape refuses an existing table that migrating would not make the
// store's inbox: one that is not a table, not shaped like any version of
// the inbox, or of the other layout.
func (d *Dialect) checkShape(cat catalog) error {
	if d.Relkind != "" {
		l, ok := layoutOf(cat.relkind)
		if !ok {
			what := relationKinds[cat.relkind]
			if what == "" {
				what = fmt.Sprintf("a relation of kind %q", cat.relkind)
			}
			return &NotInboxError{Table: d.Table.String(), Kind: what}
		}
		if l != d.Layout {
			return &LayoutError{Table: d.Table.String(), Has: l, Want: d.Layout}
		}
	}
	if missing := cat.missingFirstColumns(); len(missing) > 0 {
		return &NotInboxError{Table: d.Table.String(), Missing: missing}
	}
	return nil
}

// NotInboxError is a table, named as the inbox, that exists and is not an
// idem inbox of any schema version: migrating it would fail or take it
// over. It matches [idem.ErrConfig] with errors.Is.
type NotInboxError struct {
	Table string
	// Missing is the columns every inbox has had that the table lacks.
	Missing []string
	// Kind, when the relation is not a table at all, says what it is ("a
	// view").
	Kind string
}

// What says what the table is, without the fix: "table t exists and is
// not an idem inbox (it has no column consumer, key, …)".
func (e *NotInboxError) What() string {
	if e.Kind != "" {
		return fmt.Sprintf("%s exists and is not an idem inbox (it is %s, not a table)", e.Table, e.Kind)
	}
	return fmt.Sprintf("table %s exists and is not an idem inbox (it has no column %s)", e.Table, strings.Join(e.Missing, ", "))
}

func (e *NotInboxError) Error() string {
	return e.What() + ": name another table for the inbox, or rename this one aside"
}

// Is matches [idem.ErrConfig].
func (e *NotInboxError) Is(target error) bool { return target == idem.ErrConfig }

// LayoutError is an existing inbox table of another layout than the store
// is configured for: the layout is chosen when the table is created and
// kept. It matches [idem.ErrConfig] with errors.Is.
type LayoutError struct {
	Table     string
	Has, Want idem.Layout
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("table %s has the %s layout, and a layout applies only to a new table: configure the store for the %s layout, or name another table for a %s inbox",
		e.Table, e.Has, e.Has, e.Want)
}

// Is matches [idem.ErrConfig].
func (e *LayoutError) Is(target error) bool { return target == idem.ErrConfig }

// isNoRows reports the "no rows" error of pgx or database/sql.
func isNoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}
