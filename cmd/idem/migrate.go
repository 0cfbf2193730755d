package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/idemmigrate"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() {
	register(command{name: "migrate", summary: "create or upgrade every idem table of a database (inbox, outbox, idempotency keys, dead-letter audit), recorded in one version table", run: runMigrate})
	register(command{name: "ddl", summary: "print the SQL idem migrate runs, for golang-migrate, goose, Atlas or Flyway (--format)", run: runDDL})
}

const migrateDoc = `Creates every idem table of the database, or upgrades it to this build's schema, in one
transaction under one lock, and records each table's schema version in idem_migrations
beside it. Safe to run on every deploy and from several instances at once: migrators
queue. A database migrated before idem_migrations recorded every table (the outbox's
<table>_meta row, an idempotency-keys table) is adopted: nothing is run again.

Components (--only, comma-separated; default: every one the database stores):
  inbox    the inbox table and its bookkeeping (PostgreSQL, MySQL/MariaDB, SQLite)
  outbox   the outbox table, its leases, relays and meta (PostgreSQL, SQLite)
  idemkey  the idempotency keys table (PostgreSQL)
  dlq      the dead-letter operators' audit tables, beside the inbox (PostgreSQL)`

// componentFlags are the flags naming each component's table, shared by
// migrate and ddl.
type componentFlags struct {
	only        string
	inbox       string
	layout      string
	window      time.Duration
	outbox      string
	shards      int
	keys        string
	layoutGiven bool
	fs          *cmdFlags
}

func (c *componentFlags) add(fs *cmdFlags, window time.Duration) {
	c.fs = fs
	fs.StringVar(&c.only, "only", "", "components to migrate, comma-separated: inbox, outbox, idemkey, dlq (default: every one the database stores)")
	fs.StringVar(&c.inbox, "inbox-table", "idem_inbox", "inbox table, optionally schema-qualified (the dead-letter audit tables go in its schema); as --table of idem inbox")
	fs.StringVar(&c.layout, "layout", "plain", "layout of a new inbox table: plain or partitioned (PostgreSQL)")
	fs.DurationVar(&c.window, "window", window, "retention window recorded for a new inbox table (an existing one keeps its own)")
	fs.StringVar(&c.outbox, "outbox-table", "idem_outbox", "outbox table, optionally schema-qualified; as --table of idem outbox")
	fs.IntVar(&c.shards, "shards", 0, "shards of a new outbox table (0: 16); an existing one keeps its count")
	fs.StringVar(&c.keys, "keys-table", "idem_idempotency_keys", "idempotency keys table, optionally schema-qualified")
}

// config is the migrator's configuration the flags give.
func (c *componentFlags) config() (*idemmigrate.Config, error) {
	c.fs.Visit(func(fl *flag.Flag) { c.layoutGiven = c.layoutGiven || fl.Name == "layout" })
	cfg := &idemmigrate.Config{InboxTable: c.inbox, InboxWindow: c.window, OutboxTable: c.outbox, OutboxShards: c.shards, IdempotencyKeysTable: c.keys}
	switch c.layout {
	case "plain":
	case "partitioned":
		cfg.InboxLayout = idemstore.LayoutPartitioned
	default:
		return nil, c.fs.usagef("--layout %q: want plain or partitioned", c.layout)
	}
	if c.window < 0 {
		return nil, c.fs.usagef("--window must be positive")
	}
	if c.shards < 0 {
		return nil, c.fs.usagef("--shards must not be negative (0: the default, 16)")
	}
	if c.only != "" {
		for p := range strings.SplitSeq(c.only, ",") {
			if p = strings.TrimSpace(p); p != "" {
				cfg.Only = append(cfg.Only, p)
			}
		}
	}
	return cfg, nil
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("migrate", "[flags]", migrateDoc, stdout)
	var t migrateTarget
	t.add(fs)
	versions := fs.Bool("versions", false, "print each table's schema version and this build's, and migrate nothing")
	jsonOut := fs.Bool("json", false, "print JSON")
	var c componentFlags
	c.add(fs, 0)
	if err := fs.parse(args, false); err != nil {
		return err
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	if err := t.validate(fs); err != nil {
		return err
	}
	if err := t.open(ctx, fs, cfg); err != nil {
		return err
	}
	defer t.close()
	if *versions {
		rs, err := t.m.GetVersion(ctx)
		if err != nil {
			return fmt.Errorf("reading the schema versions in %s: %w", t.where, err)
		}
		return printMigrated(stdout, *jsonOut, t.where, rs, true, 0)
	}
	partitions := 0
	if t.pool != nil {
		if err := t.keepLayout(ctx, cfg, c.layoutGiven); err != nil {
			return err
		}
	}
	rs, err := t.m.Migrate(ctx)
	if err != nil {
		return fmt.Errorf("migrating %s: %w", t.where, err)
	}
	if t.pool != nil && cfg.InboxLayout == idemstore.LayoutPartitioned && slices.Contains(t.m.Components(), idemmigrate.Inbox) {
		if partitions, err = t.createPartitions(ctx, cfg); err != nil {
			return err
		}
	}
	return printMigrated(stdout, *jsonOut, t.where, rs, false, partitions)
}

// migrateTarget is the database idem migrate works on: one of --database
// (PostgreSQL), --sqlite and --mysql, its migrator once opened, and where
// it is, said with any password redacted.
type migrateTarget struct {
	db     dbFlags
	sqlite string
	mysql  string
	m      *idemmigrate.Migrator
	where  string
	pool   *pgxpool.Pool // PostgreSQL only
	closes []func()
}

// add adds the flags that name the database.
func (t *migrateTarget) add(fs *cmdFlags) {
	t.db.add(fs.FlagSet)
	fs.StringVar(&t.sqlite, "sqlite", "", "SQLite database file, instead of --database")
	fs.StringVar(&t.mysql, "mysql", "", mysqlFlagHelp)
}

// validate checks that the flags name one database, a MySQL one with
// --mysql.
func (t *migrateTarget) validate(fs *cmdFlags) error {
	switch {
	case t.sqlite != "" && (t.db.database != "" || t.mysql != ""), t.mysql != "" && t.db.database != "":
		return fs.usagef("--database, --sqlite and --mysql name three databases: give one")
	case looksLikeMySQL(t.db.database):
		return fs.usagef("--database takes a PostgreSQL URL; for MySQL or MariaDB give the DSN with --mysql (%s)", mysqlForm)
	}
	return t.db.validate()
}

// open connects to the database and makes its migrator for cfg; close
// releases what it opened, even when it failed.
func (t *migrateTarget) open(ctx context.Context, fs *cmdFlags, cfg *idemmigrate.Config) error {
	switch {
	case t.sqlite != "":
		sdb, err := openSQLite(ctx, t.sqlite)
		if err != nil {
			return err
		}
		t.closes = append(t.closes, func() { sdb.Close() })
		t.where = "SQLite " + t.sqlite
		t.m, err = newSQLMigrator(sdb, idemmigrate.SQLite, cfg, fs)
		return err
	case t.mysql != "":
		parsed, err := checkMySQL(t.mysql)
		if err != nil {
			return fs.usagef("%s", err)
		}
		mdb, err := openMySQL(ctx, t.mysql, &t.db)
		if err != nil {
			return err
		}
		t.closes = append(t.closes, func() { mdb.Close() })
		t.where = mysqlWhere(parsed)
		t.m, err = newSQLMigrator(mdb, idemmigrate.MySQL, cfg, fs)
		return err
	}
	pool, err := t.db.pool(ctx)
	if err != nil {
		return err
	}
	t.closes = append(t.closes, pool.Close)
	t.pool = pool
	t.where = "PostgreSQL " + redactURL(databaseURL(t.db.database))
	if t.m, err = idemmigrate.NewPgx(pool, cfg); err != nil {
		return fs.usagef("%v", err)
	}
	return nil
}

// close closes what open opened.
func (t *migrateTarget) close() {
	for _, c := range slices.Backward(t.closes) {
		c()
	}
}

// keepLayout makes an existing partitioned PostgreSQL inbox keep its
// layout when --layout was not given, so that the same command runs on
// every deploy: the migrator is made again for it.
func (t *migrateTarget) keepLayout(ctx context.Context, cfg *idemmigrate.Config, layoutGiven bool) error {
	if layoutGiven || !slices.Contains(t.m.Components(), idemmigrate.Inbox) {
		return nil
	}
	f := &inboxFlags{table: cfg.InboxTable}
	has, err := f.existingLayout(ctx, t.pool)
	if err != nil || has == nil || *has != pgxinbox.Partitioned {
		return err
	}
	cfg.InboxLayout = idemstore.LayoutPartitioned
	t.m, err = idemmigrate.NewPgx(t.pool, cfg)
	return err
}

// createPartitions creates the daily partitions a partitioned inbox's
// window needs, once the schema is migrated: the partitions are the
// store's, and its migrate (a no-op on the schema by then) creates them.
func (t *migrateTarget) createPartitions(ctx context.Context, cfg *idemmigrate.Config) (int, error) {
	store, err := pgxinbox.New(t.pool, &pgxinbox.Config{Table: cfg.InboxTable, Layout: pgxinbox.Partitioned})
	if err != nil {
		return 0, err
	}
	rep, err := store.MigrateReport(ctx)
	if err != nil {
		return 0, fmt.Errorf("creating the partitions of %s in %s: %w", cfg.InboxTable, t.where, err)
	}
	return rep.Partitions, nil
}

func newSQLMigrator(db *sql.DB, e idemmigrate.Engine, cfg *idemmigrate.Config, fs *cmdFlags) (*idemmigrate.Migrator, error) {
	m, err := idemmigrate.NewSQL(db, e, cfg)
	if err != nil {
		return nil, fs.usagef("%v", err)
	}
	return m, nil
}

// printMigrated says what was done to each component of the database at
// where (or, with versions, where each stands).
func printMigrated(w io.Writer, jsonOut bool, where string, rs []idemmigrate.Result, versions bool, partitions int) error {
	if jsonOut {
		type row struct {
			Component string `json:"component"`
			Table     string `json:"table"`
			From      int    `json:"from"`
			To        int    `json:"to"`
			Adopted   bool   `json:"adopted,omitempty"`
		}
		out := struct {
			Database   string `json:"database"`
			Components []row  `json:"components"`
			Partitions int    `json:"partitions,omitempty"`
		}{Database: where, Partitions: partitions}
		for _, r := range rs {
			out.Components = append(out.Components, row{r.Component, r.Table, r.From, r.To, r.Adopted})
		}
		return printJSON(w, out)
	}
	fmt.Fprintf(w, "database: %s\n", where)
	for _, r := range rs {
		var what string
		switch {
		case versions && r.From == r.To:
			what = fmt.Sprintf("schema version %d, up to date", r.To)
		case versions:
			what = fmt.Sprintf("schema version %d, this build's is %d: run idem migrate", r.From, r.To)
		case r.From == 0:
			what = fmt.Sprintf("created (schema version %d)", r.To)
		case r.From < r.To:
			what = fmt.Sprintf("migrated from schema version %d to %d", r.From, r.To)
		default:
			what = fmt.Sprintf("up to date (schema version %d)", r.To)
		}
		if r.Adopted {
			what += ", its version adopted into idem_migrations"
		}
		fmt.Fprintf(w, "  %-8s %s: %s\n", r.Component, r.Table, what)
	}
	if partitions > 0 {
		fmt.Fprintf(w, "  created %d daily partitions of the inbox\n", partitions)
	}
	return nil
}

const allDDLDoc = `Prints the SQL that 'idem migrate' runs on a new database, for a migration tool to run
instead: every component's tables (see idem migrate -h), their settings, and each
one's schema version in idem_migrations, so that consumers and a later 'idem migrate'
find them up to date. It is rendered from the same migration files migrate applies.
The inbox's part is what 'idem inbox ddl' prints.

Formats:
  plain           the SQL, to stdout; --down prints the SQL that removes it
  goose           one file with -- +goose Up / Down: to stdout, or NNNNN_idem.sql in --out
  golang-migrate  NNNNNN_idem.up.sql and .down.sql, written into --out
  flyway          V<n>__idem.sql: to stdout, or into --out
In --out the file number is --seq, by default one more than the highest there.
Apply it once, to a database without idem tables; upgrade with 'idem migrate'.`

func runDDL(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newCmdFlags("ddl", "[flags]", allDDLDoc, stdout)
	dialect := fs.String("dialect", "postgres", "database: postgres, sqlite or mysql (MySQL 8.0 and MariaDB)")
	format := fs.String("format", "plain", "output: "+strings.Join(ddlFormats, ", "))
	out := fs.String("out", "", "directory to write the migration files into (golang-migrate: required)")
	seq := fs.Int("seq", 0, "number of the migration file in --out (default: one more than the highest there)")
	down := fs.Bool("down", false, "plain format: print the SQL that removes the tables instead")
	var c componentFlags
	c.add(fs, retention.DefaultWindow)
	if err := fs.parse(args, false); err != nil {
		return err
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	if *seq < 0 {
		return fs.usagef("--seq must be positive")
	}
	var e idemmigrate.Engine
	switch *dialect {
	case "postgres":
		e = idemmigrate.Postgres
	case "sqlite":
		e = idemmigrate.SQLite
	case "mysql", "mariadb":
		e = idemmigrate.MySQL
	default:
		return fs.usagef("--dialect %q: want postgres, sqlite or mysql", *dialect)
	}
	sc, err := idemmigrate.NewScript(e, cfg)
	if err != nil {
		return fs.usagef("%v", err)
	}
	if *down && *format != "plain" {
		return fs.usagef("--down is for --format plain; the other formats carry their down migration")
	}
	const title = "idem"
	switch *format {
	case "plain":
		if *out != "" {
			return fs.usagef("--format plain prints to stdout; redirect it, or choose a --format that writes files")
		}
		text := sc.UpSQL()
		if *down {
			text = sc.DownSQL()
		}
		_, err = io.WriteString(stdout, text)
		return err
	case "goose", "flyway":
		text := "-- +goose Up\n" + idemmigrate.Text(sc.Up, true) + "\n-- +goose Down\n" + idemmigrate.Text(sc.Down, true)
		if *format == "flyway" {
			text = sc.UpSQL()
		}
		if *out == "" {
			_, err = io.WriteString(stdout, text)
			return err
		}
		return writeMigrations(stdout, *out, *format, *seq, title, map[string]string{"": text})
	case "golang-migrate":
		if *out == "" {
			return fs.usagef("--format golang-migrate writes two files: give --out DIR")
		}
		return writeMigrations(stdout, *out, *format, *seq, title, map[string]string{".up": sc.UpSQL(), ".down": sc.DownSQL()})
	default:
		return fs.usagef("--format %q: want one of %s", *format, strings.Join(ddlFormats, ", "))
	}
}
