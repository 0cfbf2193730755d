package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
)

const ddlDoc = `Prints the SQL that 'idem inbox migrate' runs, for a migration tool to run instead:
the bookkeeping tables, every migration of this build, the schema version and the
settings row (layout and --window), so that consumers, 'idem inbox check' and a later
'idem inbox migrate' find the table up to date. It is rendered from the same migration
files migrate applies.

Formats:
  plain           the SQL, to stdout (paste it into Atlas or any tool); --down prints
                  the SQL that removes it
  goose           one file with -- +goose Up / Down (and StatementBegin/End around
                  PL/pgSQL blocks): to stdout, or NNNNN_idem_inbox.sql in --out
  golang-migrate  NNNNNN_idem_inbox.up.sql and .down.sql, written into --out
  flyway          V<n>__idem_inbox.sql: to stdout, or into --out (Flyway has no down
                  in its free edition; print it with --format plain --down)
In --out the file number is --seq, by default one more than the highest there.

Partitioned tables: the daily partitions are not in the DDL (they depend on the day);
run 'idem inbox partitions ensure --table T' after applying it, then daily.

Upgrading idem: migrations are only ever added. On PostgreSQL the DDL is safe to run
again on a table of any older version (each migration runs only where the recorded
version is below it, and a newer table is refused), so render it into a new migration
file of your tool; --from-version N renders only what is newer than version N (the
version 'idem inbox check' and the DDL's header report). On MySQL and MariaDB
(--dialect mysql) every statement is idempotent, as DDL there commits implicitly:
safe to run again too. SQLite has no conditional DDL: apply each rendered file
once, and upgrade with --from-version N. Or let
'idem inbox migrate' upgrade the table on deploy instead.`

// ddlFormats are the --format values and what they write.
var ddlFormats = []string{"plain", "goose", "golang-migrate", "flyway"}

func inboxDDL(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newCmdFlags("inbox ddl", "[flags]", ddlDoc, stdout)
	table := fs.String("table", "idem_inbox", "inbox table, optionally schema-qualified (PostgreSQL)")
	layout := fs.String("layout", "plain", "layout: plain or partitioned (PostgreSQL)")
	dialect := fs.String("dialect", "postgres", "database: postgres, sqlite or mysql (MySQL 8.0 and MariaDB)")
	window := fs.Duration("window", retention.DefaultWindow, "retention window recorded for a new table (an existing one keeps its own)")
	format := fs.String("format", "plain", "output: "+strings.Join(ddlFormats, ", "))
	out := fs.String("out", "", "directory to write the migration files into (golang-migrate: required)")
	from := fs.Int("from-version", 0, "render only the migrations newer than this schema version (0: a new table)")
	seq := fs.Int("seq", 0, "number of the migration file in --out (default: one more than the highest there)")
	down := fs.Bool("down", false, "plain format: print the SQL that removes the table instead")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if *window <= 0 {
		return fs.usagef("--window must be positive")
	}
	if *seq < 0 {
		return fs.usagef("--seq must be positive")
	}
	var l idemstore.Layout
	switch *layout {
	case "plain":
		l = idemstore.LayoutPlain
	case "partitioned":
		l = idemstore.LayoutPartitioned
	default:
		return fs.usagef("--layout %q: want plain or partitioned", *layout)
	}
	// The library's own functions validate the name, with their errors.
	var err error
	switch *dialect {
	case "postgres":
		_, err = pgxinbox.DDL(*table, l, *window)
	case "sqlite":
		if l != idemstore.LayoutPlain {
			return fs.usagef("SQLite inboxes have the plain layout")
		}
		_, err = sqlinbox.DDL(sqlinbox.SQLite, *table, *window)
	case "mysql", "mariadb":
		if l != idemstore.LayoutPlain {
			return fs.usagef("MySQL and MariaDB inboxes have the plain layout")
		}
		*dialect = "mysql"
		_, err = sqlinbox.DDL(sqlinbox.MySQL, *table, *window)
	default:
		return fs.usagef("--dialect %q: want postgres, sqlite or mysql", *dialect)
	}
	if err != nil {
		return fs.usagef("--table: %v", err)
	}
	sc, err := ddlScript(*dialect, *table, l, *window, *from)
	if err != nil {
		return fs.usagef("--from-version: %v", err)
	}
	if *down && *format != "plain" {
		return fs.usagef("--down is for --format plain; the other formats carry their down migration")
	}
	switch *format {
	case "plain":
		if *out != "" {
			return fs.usagef("--format plain prints to stdout; redirect it, or choose a --format that writes files")
		}
		if *down {
			if len(sc.Down) == 0 {
				return fs.usagef("an upgrade (--from-version) has no down migration: idem's migrations are not undone")
			}
			_, err = io.WriteString(stdout, sc.DownSQL())
			return err
		}
		_, err = io.WriteString(stdout, sc.UpSQL())
		return err
	case "goose", "flyway":
		text := gooseFile(sc)
		if *format == "flyway" {
			text = sc.UpSQL()
		}
		if *out == "" {
			_, err = io.WriteString(stdout, text)
			return err
		}
		return writeMigrations(stdout, *out, *format, *seq, inboxTitle(sc), map[string]string{"": text})
	case "golang-migrate":
		if *out == "" {
			return fs.usagef("--format golang-migrate writes two files: give --out DIR")
		}
		files := map[string]string{".up": sc.UpSQL()}
		if len(sc.Down) > 0 {
			files[".down"] = sc.DownSQL()
		}
		return writeMigrations(stdout, *out, *format, *seq, inboxTitle(sc), files)
	default:
		return fs.usagef("--format %q: want one of %s", *format, strings.Join(ddlFormats, ", "))
	}
}

// ddlScript renders the script of the validated table.
func ddlScript(dialect, table string, l idemstore.Layout, window time.Duration, from int) (inboxdb.Script, error) {
	var t inboxdb.Table
	if s, n, ok := strings.Cut(table, "."); ok {
		t = inboxdb.Table{Schema: s, Name: n}
	} else {
		t.Name = table
	}
	d := inboxdb.SQLite(t)
	switch dialect {
	case "postgres":
		d = inboxdb.Postgres(t, l)
	case "mysql":
		d = inboxdb.MySQL(t)
	}
	return d.Script(window, from)
}

// gooseFile is the script as one goose migration.
func gooseFile(sc inboxdb.Script) string {
	var b strings.Builder
	b.WriteString("-- +goose Up\n")
	b.WriteString(sc.Header())
	b.WriteString("\n")
	b.WriteString(inboxdb.Text(sc.Up, true))
	b.WriteString("\n-- +goose Down\n")
	if len(sc.Down) == 0 {
		b.WriteString("-- idem's migrations are not undone: restore the table from a backup to go back.\n")
	} else {
		b.WriteString(inboxdb.Text(sc.Down, true))
	}
	return b.String()
}

// migrationNumber finds the version number in a migration file's name, per
// tool.
var migrationNumber = map[string]*regexp.Regexp{
	"goose":          regexp.MustCompile(`^(\d+)_.*\.sql$`),
	"golang-migrate": regexp.MustCompile(`^(\d+)_.*\.(up|down)\.sql$`),
	"flyway":         regexp.MustCompile(`^V(\d+)__.*\.sql$`),
}

// numberWidth is how each tool's own generator pads the number.
var numberWidth = map[string]int{"goose": 5, "golang-migrate": 6, "flyway": 0}

// inboxTitle names the migration files of an inbox script.
func inboxTitle(sc inboxdb.Script) string {
	if sc.From > 0 {
		return fmt.Sprintf("idem_inbox_to_v%d", sc.Version)
	}
	return "idem_inbox"
}

// writeMigrations writes files (suffix → content) named for format into
// dir, numbered seq (0: after the highest number there), refusing to
// overwrite, and says what it wrote.
func writeMigrations(stdout io.Writer, dir, format string, seq int, title string, files map[string]string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating --out %s: %w", dir, err)
		}
	} else if err != nil {
		return fmt.Errorf("reading --out %s: %w", dir, err)
	}
	width := numberWidth[format]
	if seq == 0 {
		highest := int64(0)
		for _, e := range entries {
			m := migrationNumber[format].FindStringSubmatch(e.Name())
			if m == nil {
				continue
			}
			if n, err := strconv.ParseInt(m[1], 10, 64); err == nil && n >= highest {
				highest = n
				width = max(width, len(m[1]))
			}
		}
		seq = int(highest + 1)
	}
	num := fmt.Sprintf("%0*d", width, seq)
	name := func(suffix string) string {
		switch format {
		case "flyway":
			return "V" + num + "__" + title + ".sql"
		case "goose":
			return num + "_" + title + ".sql"
		}
		return num + "_" + title + suffix + ".sql"
	}
	for _, suffix := range []string{"", ".up", ".down"} {
		if _, ok := files[suffix]; !ok {
			continue
		}
		p := filepath.Join(dir, name(suffix))
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s exists already: choose another --seq", p)
		}
	}
	for _, suffix := range []string{"", ".up", ".down"} {
		text, ok := files[suffix]
		if !ok {
			continue
		}
		p := filepath.Join(dir, name(suffix))
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		fmt.Fprintf(stdout, "wrote %s\n", p)
	}
	return nil
}

const checkDoc = `Verifies the inbox table the way a consumer does before it starts: the table exists
with the inbox's columns, its unique key on (consumer, key) (partitioned: and
partition_time) and its keep_until index; its layout matches the stored one; the stored
window is there; the schema version is this build's (older: migrate; newer: this
binary is older than the one that migrated it); partitioned: today and tomorrow have a
partition. Prints OK, or each problem with its fix. A schema newer than this build is
reported, but consumers of this build still start on it and log it, so that a rolling
deploy, which migrates while older consumers run, is not stopped by their restarts.
It also reads the database's commit and replication settings (PostgreSQL:
synchronous_commit, synchronous_standby_names, fsync, the streaming standbys) and warns
when a commit the database acknowledged could be lost in a crash or a failover, with
its fix: such a warning, which consumers log at start too, leaves the exit status as it is.

exit status: 0 no problem, 1 problems found, 3 the check could not run.`

func inboxCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("check", checkDoc, stdout, stderr, true)
	layout := f.fs.String("layout", "", "layout the consumers are configured for: plain or partitioned (default: the table's own)")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := f.noWindow(); err != nil {
		return err
	}
	switch *layout {
	case "", "plain", "partitioned":
	default:
		return f.fs.usagef("--layout %q: want plain or partitioned", *layout)
	}
	var checker interface {
		Check(context.Context) ([]idemstore.SchemaProblem, error)
	}
	if f.mysql != "" {
		if *layout == "partitioned" {
			return f.fs.usagef("MySQL and MariaDB inboxes have the plain layout")
		}
		db, err := openMySQL(ctx, f.mysql, &f.db)
		if err != nil {
			return err
		}
		defer db.Close()
		store, err := mysqlinbox.New(db, &sqlinbox.Config{Table: f.table, Logger: f.logger})
		if err != nil {
			return err
		}
		checker = store
	} else if f.sqlite != "" {
		if *layout == "partitioned" {
			return f.fs.usagef("SQLite inboxes have the plain layout")
		}
		if _, err := os.Stat(f.sqlite); err != nil {
			return fmt.Errorf("opening SQLite inbox: %w", err)
		}
		db, err := openSQLite(ctx, f.sqlite)
		if err != nil {
			return err
		}
		defer db.Close()
		store, err := sqlinbox.New(db, sqlinbox.SQLite, &sqlinbox.Config{Table: f.table, Logger: f.logger})
		if err != nil {
			return f.fs.usagef("--table: %v", err)
		}
		checker = store
	} else {
		pool, err := f.db.pool(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		l := pgxinbox.Plain
		switch *layout {
		case "partitioned":
			l = pgxinbox.Partitioned
		case "":
			var kind *string
			if err := pool.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))`, f.table).Scan(&kind); err != nil {
				return fmt.Errorf("looking up table %s: %w", f.table, err)
			}
			if kind != nil && *kind == "p" {
				l = pgxinbox.Partitioned
			}
		}
		store, err := pgxinbox.New(pool, &pgxinbox.Config{Table: f.table, Layout: l, Logger: f.logger})
		if err != nil {
			return f.fs.usagef("--table: %v", err)
		}
		checker = store
	}
	probs, err := checker.Check(ctx)
	if err != nil {
		return err
	}
	dur, durErr := readDurability(ctx, checker)
	if f.jsonOut {
		type problem struct {
			What     string `json:"what"`
			Fix      string `json:"fix"`
			Advisory bool   `json:"advisory,omitempty"`
		}
		ps := make([]problem, len(probs))
		for i, p := range probs {
			ps[i] = problem{p.What, p.Fix, p.Advisory}
		}
		doc := map[string]any{"table": f.table, "ok": len(probs) == 0, "problems": ps}
		if d := durabilityJSON(dur, durErr); d != nil {
			doc["durability"] = d
		}
		if err := printJSON(stdout, doc); err != nil {
			return err
		}
	} else {
		if len(probs) == 0 {
			fmt.Fprintf(stdout, "%s: OK\n", f.table)
		}
		for _, p := range probs {
			fmt.Fprintf(stdout, "%s\n  fix: %s\n", p.What, p.Fix)
			if p.Advisory {
				fmt.Fprintln(stdout, "  (advisory: consumers of this build still start and log it, so a rolling deploy is not stopped)")
			}
		}
		printDurability(stdout, dur, durErr)
	}
	if len(probs) > 0 {
		return &exitError{code: exitFindings}
	}
	return nil
}
