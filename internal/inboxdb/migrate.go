package inboxdb

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/migrator"
)

// The bookkeeping tables, created beside the inbox (in its schema) and
// shared by every inbox table there, keyed by the table's quoted name.
const (
	// migrationsTable: the schema version of each inbox table.
	migrationsTable = "idem_migrations"
	// settingsTable: each inbox's layout and retention window (docs/design.md
	// 10), written by Migrate, changed only by SetWindow.
	settingsTable = "idem_inbox_settings"
	// horizonsTable: the horizon each consumer of an inbox last reported.
	horizonsTable = "idem_inbox_horizons"
	// prunedTable: summaries (Bloom filters) of the keys each prune deleted,
	// per consumer, so a message whose marker is gone can still be told.
	prunedTable = "idem_inbox_pruned"
	// pausesTable: the consumers operators paused, one row each
	// (`idem consumer pause`); pauseLogTable: every pause and resume,
	// rows only ever inserted.
	pausesTable   = "idem_consumer_pauses"
	pauseLogTable = "idem_consumer_pause_log"
	// positionsTable: how far each consumer of an inbox has settled each
	// source of a log broker (a Kafka partition), written in the
	// transaction of the claims it vouches for (docs/design.md 17).
	positionsTable = "idem_inbox_positions"
)

// migrationFS holds one directory of numbered templates per dialect and
// layout (0001_inbox.sql, 0002_…). A migration is never edited once
// released: a change is a new file, so every database converges on the
// same schema. PostgreSQL's plain layout is the same for both stores.
//
//go:embed migrations
var migrationFS embed.FS

// migrationList renders d's templates for its table, in version order.
func (d *Dialect) migrationList() ([]migrator.Migration, error) {
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
	return migrator.Load(migrationFS, d.migrations, data, funcs)
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
func (b *Inbox) Migrate(ctx context.Context) (idemstore.Settings, error) {
	s, _, err := b.MigrateReport(ctx)
	return s, err
}

// MigrateReport is [Inbox.Migrate] that also says what it did: whether it
// created the table, and the schema versions before and after.
func (b *Inbox) MigrateReport(ctx context.Context) (idemstore.Settings, idemstore.MigrateReport, error) {
	s, r, err := b.migrate(ctx)
	if err != nil {
		return s, r, fmt.Errorf("migrating inbox table %s: %w", b.D.Table, err)
	}
	return s, r, nil
}

func (b *Inbox) migrate(ctx context.Context) (set idemstore.Settings, rep idemstore.MigrateReport, err error) {
	rep.Table = b.D.Table.String()
	comp, err := b.Component(&set, &rep)
	if err != nil {
		return set, rep, err
	}
	tx, err := b.Driver.BeginMigration(ctx)
	if err != nil {
		return set, rep, fmt.Errorf("beginning migration: %w", err)
	}
	defer rollback(ctx, tx)
	if _, err := migrator.Apply(ctx, tx, migrator.Engine(b.D.Name), comp); err != nil {
		return set, rep, err
	}
	if err := tx.Commit(ctx); err != nil {
		return set, rep, fmt.Errorf("committing migration: %w", err)
	}
	return set, rep, nil
}

// Component is the inbox table as the one migrator of every idem table sees
// it: the bookkeeping tables created first, an existing table refused when
// it is not this store's inbox, and the settings recorded after the
// migrations. The versions were always in the version table. Once it has
// run, *set and *rep hold what [Inbox.MigrateReport] returns.
func (b *Inbox) Component(set *idemstore.Settings, rep *idemstore.MigrateReport) (*migrator.Component, error) {
	d := b.D
	ms, err := d.migrationList()
	if err != nil {
		return nil, err
	}
	rep.Table = d.Table.String()
	key := d.Table.Quoted()
	return &migrator.Component{
		Name:       "inbox",
		Table:      d.Table.String(),
		Key:        key,
		Book:       d.Table.Sibling(migrationsTable),
		Migrations: ms,
		Setup: func(ctx context.Context, c migrator.Conn) error {
			for _, q := range d.Bookkeeping {
				if _, err := c.Exec(ctx, q); err != nil {
					return fmt.Errorf("creating the bookkeeping tables: %w", err)
				}
			}
			return nil
		},
		Check: func(ctx context.Context, c migrator.Conn, from int) error {
			existed, err := d.tableExists(ctx, c)
			if err != nil {
				return fmt.Errorf("looking for the table: %w", err)
			}
			rep.Created, rep.From, rep.To = !existed, from, len(ms)
			if !existed {
				return nil
			}
			// CREATE TABLE IF NOT EXISTS keeps a table of another shape or
			// layout; the migrations after it would fail on it with the
			// database's words, or worse, succeed.
			cat, err := d.readCatalog(ctx, c)
			if err != nil {
				return fmt.Errorf("reading the catalog: %w", err)
			}
			return d.checkShape(cat)
		},
		After: func(ctx context.Context, c migrator.Conn, _, _ int) error {
			s, r, err := b.recordSettings(ctx, c)
			*set = s
			rep.Layout, rep.Window = r.Layout, r.Window
			return err
		},
	}, nil
}

// recordSettings writes the settings of a table that has none, and checks
// those of one that has.
func (b *Inbox) recordSettings(ctx context.Context, c Conn) (set idemstore.Settings, rep idemstore.MigrateReport, err error) {
	d := b.D
	key := d.Table.Quoted()
	st, found, err := b.readSettings(ctx, c)
	if err != nil {
		return set, rep, err
	}
	switch {
	case !found:
		set = idemstore.Settings{Layout: d.Layout, Window: b.Window}
		if set.Window == 0 {
			set.Window = DefaultWindow
		}
		rep.Layout, rep.Window = set.Layout, set.Window
		if _, err := c.Exec(ctx, d.InsertSettings, key, set.Layout.String(), set.Window.Milliseconds()); err != nil {
			return set, rep, fmt.Errorf("recording the inbox settings: %w", err)
		}
	case st.Layout != d.Layout:
		return set, rep, &LayoutError{Table: d.Table.String(), Has: st.Layout, Want: d.Layout}
	case b.Window != 0 && b.Window != st.Window:
		return set, rep, fmt.Errorf("%w: the configured window %v differs from the window stored with table %s, %v; "+
			"leave the window unset to use the stored one, or change it for every consumer with: idem inbox window set %v --table %s",
			idem.ErrConfig, b.Window, d.Table, st.Window, b.Window, d.Table)
	default:
		set = idemstore.Settings{Layout: st.Layout, Window: st.Guard}
		rep.Layout, rep.Window = st.Layout, st.Window
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
func layoutOf(relkind string) (l idemstore.Layout, ok bool) {
	switch relkind {
	case "r":
		return idemstore.LayoutPlain, true
	case "p":
		return idemstore.LayoutPartitioned, true
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
	Has, Want idemstore.Layout
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
