package inboxdb

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/migrator"
)

// Script is the SQL Migrate runs for one inbox table, for a migration tool
// to run instead: the bookkeeping tables, the table's migrations, its schema
// version and its settings. It is rendered from the same migration files
// Migrate applies, so the two cannot drift apart.
type Script struct {
	// Table and Layout are the inbox's; Dialect names the database.
	Table   Table
	Layout  idemstore.Layout
	Dialect string
	// Window is the window recorded for a new table.
	Window time.Duration
	// From is the schema version the script starts from (0: a new table);
	// Version the one it leaves.
	From, Version int
	// Up creates or upgrades; Down removes what Up created (empty when
	// From > 0: upgrades are not undone).
	Up, Down []Block
}

// Block is one statement of a [Script].
type Block struct {
	SQL string
	// Compound marks a statement with semicolons inside (a PL/pgSQL
	// block), which some tools must be told not to split (goose's
	// StatementBegin/End).
	Compound bool
}

// LatestVersion is the schema version this build's migrations leave d's
// table at.
func (d *Dialect) LatestVersion() (int, error) {
	ms, err := d.migrationList()
	if err != nil {
		return 0, err
	}
	return len(ms), nil
}

// Script renders the SQL Migrate runs for d's table from schema version
// from (0: a new table) to the newest, recording window (DefaultWindow when
// 0) for a table that has no settings yet.
//
// On PostgreSQL the script is safe to run again: the migrations run inside a
// PL/pgSQL block, each only when the recorded version is below its own, and
// the block refuses a table of a newer schema, of the other layout, or one
// older than from. SQLite has no conditional DDL: its script is meant to be
// applied once, as migration tools do.
func (d *Dialect) Script(window time.Duration, from int) (Script, error) {
	if window < 0 {
		return Script{}, fmt.Errorf("window %v must be positive", window)
	}
	if window == 0 {
		window = DefaultWindow
	}
	ms, err := d.migrationList()
	if err != nil {
		return Script{}, err
	}
	if from < 0 || from > len(ms) {
		return Script{}, fmt.Errorf("from version %d: this build knows versions 0 to %d", from, len(ms))
	}
	s := Script{Table: d.Table, Layout: d.Layout, Dialect: d.Name, Window: window, From: from, Version: len(ms)}
	for _, q := range d.Bookkeeping {
		s.Up = append(s.Up, Block{SQL: q})
	}
	key := sqlString(d.Table.Quoted())
	book, settings := d.Table.Sibling(migrationsTable), d.Table.Sibling(settingsTable)
	if d.Name == "postgres" {
		s.Up = append(s.Up, Block{SQL: d.guardedMigrations(ms, from, key), Compound: true})
	} else {
		for _, m := range ms[from:] {
			for _, stmt := range m.Statements {
				s.Up = append(s.Up, Block{SQL: "-- " + m.Name + "\n" + stmt})
			}
		}
	}
	if d.Name == "mysql" {
		s.Up = append(s.Up, mysqlScriptTail(d, key, len(ms), window)...)
		if from == 0 {
			s.Down = d.down(key)
		}
		return s, nil
	}
	// The version only grows: a rerun after a newer build migrated the
	// table must not record the older version.
	s.Up = append(s.Up,
		Block{SQL: `INSERT INTO ` + book + ` AS m (table_name, version) VALUES (` + key + `, ` + strconv.Itoa(len(ms)) + `)
ON CONFLICT (table_name) DO UPDATE SET version = excluded.version WHERE m.Version < excluded.version`},
		// A table with settings keeps them, as with Migrate and no
		// configured window.
		Block{SQL: `INSERT INTO ` + settings + ` (table_name, layout, window_ms) VALUES (` + key + `, ` +
			sqlString(d.Layout.String()) + `, ` + strconv.FormatInt(window.Milliseconds(), 10) + `)
ON CONFLICT (table_name) DO NOTHING`},
	)
	if from == 0 {
		s.Down = d.down(key)
	}
	return s, nil
}

// guardedMigrations is PostgreSQL's migrations from version from in one
// PL/pgSQL block that runs each only when the table's recorded version is
// below it.
func (d *Dialect) guardedMigrations(ms []migrator.Migration, from int, key string) string {
	book, settings := d.Table.Sibling(migrationsTable), d.Table.Sibling(settingsTable)
	name := strings.ReplaceAll(d.Table.String(), "'", "''")
	relkind := map[idemstore.Layout]string{idemstore.LayoutPlain: "r", idemstore.LayoutPartitioned: "p"}[d.Layout]
	var b strings.Builder
	fmt.Fprintf(&b, `DO $idem$
DECLARE
    idem_version int := coalesce((SELECT version FROM %s WHERE table_name = %s), 0);
BEGIN
    IF idem_version > %d THEN
        RAISE EXCEPTION 'inbox table %s has schema version %%, newer than this script''s %d: render the DDL with the idem that migrated it', idem_version;
    END IF;
`, book, key, len(ms), name, len(ms))
	if from > 0 {
		fmt.Fprintf(&b, `    IF idem_version < %d THEN
        RAISE EXCEPTION 'inbox table %s has schema version %%; this script upgrades from version %d: render it with --from-version %%', idem_version, idem_version;
    END IF;
`, from, name, from)
	}
	fmt.Fprintf(&b, `    IF EXISTS (SELECT 1 FROM %s WHERE table_name = %s AND layout <> %s) THEN
        RAISE EXCEPTION 'inbox table %s is recorded with another layout than %s';
    END IF;
`, settings, key, sqlString(d.Layout.String()), name, d.Layout)
	for _, m := range ms[from:] {
		fmt.Fprintf(&b, "    -- %s\n    IF idem_version < %d THEN\n", m.Name, m.Version)
		for _, stmt := range m.Statements {
			b.WriteString(indent(stmt, "        "))
			b.WriteString(";\n")
		}
		b.WriteString("    END IF;\n")
	}
	// CREATE TABLE IF NOT EXISTS keeps a table of the other layout.
	fmt.Fprintf(&b, `    IF (SELECT relkind FROM pg_class WHERE oid = %s::regclass) <> %s THEN
        RAISE EXCEPTION 'table %s exists, but not with the %s layout: name another table';
    END IF;
END
$idem$`, key, sqlString(relkind), name, d.Layout)
	return b.String()
}

// down removes the table and its rows in the bookkeeping tables. The
// bookkeeping tables are shared by every inbox of the schema: PostgreSQL
// drops them once no inbox is recorded in them; SQLite and MySQL, without
// conditional DDL, keep them, and keep the pauses of the table's consumers
// too: an inbox made before pauses existed has no pauses table to delete
// from.
func (d *Dialect) down(key string) []Block {
	t := d.Table
	out := []Block{{SQL: `DROP TABLE IF EXISTS ` + t.Quoted()}}
	if d.Name != "postgres" {
		// The positions table came after the others: a database migrated
		// by an older build has none. Its CREATE is the last bookkeeping
		// statement.
		out = append(out, Block{SQL: d.Bookkeeping[len(d.Bookkeeping)-1]},
			Block{SQL: `DELETE FROM ` + t.Sibling(positionsTable) + ` WHERE table_name = ` + key})
	}
	for _, bk := range []string{prunedTable, horizonsTable, settingsTable, migrationsTable} {
		out = append(out, Block{SQL: `DELETE FROM ` + t.Sibling(bk) + ` WHERE table_name = ` + key})
	}
	if d.Name == "postgres" {
		// The pauses and positions tables came later: an inbox made
		// before them has none, and its consumers' pauses and positions go
		// with it.
		out = append(out, Block{Compound: true, SQL: fmt.Sprintf(`DO $idem$
BEGIN
    IF to_regclass(%[7]s) IS NOT NULL THEN
        DELETE FROM %[5]s WHERE table_name = %[8]s;
    END IF;
    IF to_regclass(%[10]s) IS NOT NULL THEN
        DELETE FROM %[9]s WHERE table_name = %[8]s;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM %[1]s) AND NOT EXISTS (SELECT 1 FROM %[2]s)
       AND NOT EXISTS (SELECT 1 FROM %[3]s) AND NOT EXISTS (SELECT 1 FROM %[4]s) THEN
        DROP TABLE %[1]s, %[2]s, %[3]s, %[4]s;
        DROP TABLE IF EXISTS %[5]s, %[6]s, %[9]s;
    END IF;
END
$idem$`, t.Sibling(migrationsTable), t.Sibling(settingsTable), t.Sibling(horizonsTable), t.Sibling(prunedTable),
			t.Sibling(pausesTable), t.Sibling(pauseLogTable), sqlString(t.Sibling(pausesTable)), key,
			t.Sibling(positionsTable), sqlString(t.Sibling(positionsTable)))})
	}
	return out
}

// sqlString quotes s as an SQL string literal.
func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// indent prefixes every line of s.
func indent(s, prefix string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString(prefix)
		b.WriteString(line)
	}
	return b.String()
}

// Text renders blocks as one script, each statement ending in a semicolon
// on its own line's end; annotate wraps compound ones as goose wants.
func Text(blocks []Block, annotate bool) string {
	var b strings.Builder
	for i, bl := range blocks {
		if i > 0 {
			b.WriteString("\n")
		}
		if annotate && bl.Compound {
			b.WriteString("-- +goose StatementBegin\n")
		}
		b.WriteString(bl.SQL)
		b.WriteString(";\n")
		if annotate && bl.Compound {
			b.WriteString("-- +goose StatementEnd\n")
		}
	}
	return b.String()
}

// Header is the comment a rendered script starts with: what it is for and
// how to run it again.
func (s Script) Header() string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- idem inbox table %s: %s layout, %s, schema version %d", s.Table, s.Layout, s.Dialect, s.Version)
	if s.From > 0 {
		fmt.Fprintf(&b, " (upgrade from version %d)", s.From)
	}
	fmt.Fprintf(&b, ".\n-- A new table records the retention window %s (%d ms); an existing one keeps its own.\n",
		formatWindow(s.Window), s.Window.Milliseconds())
	if s.Dialect == "postgres" {
		b.WriteString("-- Safe to run again: each migration runs only on a table below its version.\n")
		b.WriteString("-- Run it in one transaction (migration tools do; psql: --single-transaction): its lock\n")
		b.WriteString("-- keeps two migrators apart only until the transaction ends.\n")
	} else {
		b.WriteString("-- SQLite has no conditional DDL: apply this once (migration tools do).\n")
	}
	if s.Layout == idemstore.LayoutPartitioned {
		fmt.Fprintf(&b, "-- Partitions are created by: idem inbox partitions ensure --table %s (after this, then daily).\n", s.Table)
	}
	return b.String()
}

// UpSQL is the whole up script: the header and every statement.
func (s Script) UpSQL() string { return s.Header() + "\n" + Text(s.Up, false) }

// DownSQL is the whole down script; "" when there is none.
func (s Script) DownSQL() string {
	if len(s.Down) == 0 {
		return ""
	}
	return fmt.Sprintf("-- Removes idem inbox table %s and its bookkeeping rows.\n\n", s.Table) + Text(s.Down, false)
}

// formatWindow writes a window in whole days when it is whole days (14d),
// as Go writes durations otherwise.
func formatWindow(w time.Duration) string {
	if w > 0 && w%day == 0 {
		return strconv.FormatInt(int64(w/day), 10) + "d"
	}
	return w.String()
}
