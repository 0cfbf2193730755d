package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
)

func init() {
	register(command{name: "inbox", summary: "the inbox table: " + inboxSummary(), run: runInbox})
}

// inboxSub is one `idem inbox` subcommand.
type inboxSub struct {
	run     inboxCommand
	summary string // one line for the subcommand list
}

// inboxCommand runs one `idem inbox` subcommand with its arguments.
type inboxCommand func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// inboxCommands is the dispatcher: a subcommand, or a group and its
// subcommand ("window show"), to what runs it. A new subcommand is one
// entry here.
var inboxCommands = map[string]inboxSub{
	"migrate":           {inboxMigrate, "create or upgrade the inbox table and record its layout and window (run it before the consumers start, and on upgrades)"},
	"prune":             {inboxPrune, "delete markers past the window in batches (plain table), or drop the daily partitions past it (partitioned table)"},
	"partitions ensure": {inboxEnsure, "create daily partitions ahead (run it daily)"},
	"partitions drop":   {inboxDrop, "drop the daily partitions past the window"},
	"stats":             {inboxStats, "rows, oldest marker, window headroom"},
	"window show":       {inboxWindowShow, "the stored layout and window, and the consumers' horizons"},
	"window set":        {inboxWindowSet, "change the stored window (<duration>; logged; --force under 1h or below a consumer's horizon)"},
	"ddl":               {inboxDDL, "print the SQL migrate runs, for golang-migrate, goose, Atlas or Flyway (--format)"},
	"check":             {inboxCheck, "verify the table, indexes, layout, stored window, schema version and partitions; each problem with its fix"},
	"positions show":    {inboxPositionsShow, "the position a Kafka consumer recorded per partition (--consumer)"},
	"positions forget":  {inboxPositionsForget, "delete a consumer's recorded positions, after a database reset on purpose (--consumer)"},
}

func inboxNames() []string {
	names := make([]string, 0, len(inboxCommands))
	for n := range inboxCommands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func inboxSummary() string { return strings.Join(inboxNames(), ", ") }

func inboxUsage(w io.Writer) {
	fmt.Fprint(w, `usage: idem inbox <subcommand> [flags]

Markers are kept for the retention window stored with the inbox table (written
by its migration, 14 days by default), counted from a marker's keep_until: the
latest of its write time and the event times of the messages that met it
(partitioned tables: its partition time). Every consumer, prune and command
reads the stored window; a prune or drop with a shorter --window is refused.

subcommands:
`)
	width := 0
	for n := range inboxCommands {
		width = max(width, len(n))
	}
	for _, n := range inboxNames() {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, inboxCommands[n].summary)
	}
	fmt.Fprint(w, "\nThe database: --database URL (PostgreSQL), --sqlite FILE, or --mysql DSN (MySQL or\nMariaDB, the driver's form "+mysqlForm+"); partitions and\nthe partitioned layout are PostgreSQL's. The layout is read from the database.\nRun 'idem inbox <subcommand> -h' for flags.\n")
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "--help" || arg == "-help" || arg == "help"
}

func runInbox(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		inboxUsage(stderr)
		return &usageError{cmd: "inbox", msg: "missing subcommand"}
	}
	if isHelp(args[0]) {
		inboxUsage(stdout)
		return nil
	}
	if len(args) > 1 {
		if sub, ok := inboxCommands[args[0]+" "+args[1]]; ok {
			return sub.run(ctx, args[2:], stdout, stderr)
		}
	}
	if sub, ok := inboxCommands[args[0]]; ok {
		return sub.run(ctx, args[1:], stdout, stderr)
	}
	// A group: `idem inbox window` alone, with -h, or with an unknown word.
	var group []string
	for _, n := range inboxNames() {
		if g, sub, ok := strings.Cut(n, " "); ok && g == args[0] {
			group = append(group, sub)
		}
	}
	switch {
	case len(group) == 0:
		return &usageError{cmd: "inbox", msg: fmt.Sprintf("unknown subcommand %q (want one of: %s)", args[0], inboxSummary())}
	case len(args) > 1 && isHelp(args[1]):
		inboxUsage(stdout)
		return nil
	case len(args) == 1 || strings.HasPrefix(args[1], "-"):
		return &usageError{cmd: "inbox " + args[0], msg: "want a subcommand: " + strings.Join(group, " or ")}
	default:
		return &usageError{cmd: "inbox " + args[0], msg: fmt.Sprintf("unknown subcommand %q (want %s)", args[1], strings.Join(group, " or "))}
	}
}

// tableName is what the inbox stores accept as a table name.
var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// inboxFlags are the flags every inbox subcommand shares.
type inboxFlags struct {
	fs      *cmdFlags
	db      dbFlags
	sqlite  string
	mysql   string
	table   string
	window  time.Duration
	jsonOut bool
	logger  *slog.Logger
}

// newInboxFlags returns the flags of `idem inbox <name>`, documented by
// doc; sqliteOK adds --sqlite and --mysql, the databases of package
// sqlinbox beside PostgreSQL's --database. Help goes to stdout, the store's log lines
// to stderr.
func newInboxFlags(name, doc string, stdout, stderr io.Writer, sqliteOK bool) *inboxFlags {
	synopsis := "[flags]"
	if n, args, ok := strings.Cut(name, " <"); ok {
		name, synopsis = n, "<"+args+" [flags]"
	}
	f := &inboxFlags{fs: newCmdFlags("inbox "+name, synopsis, doc, stdout), logger: slog.New(slog.NewTextHandler(stderr, nil))}
	f.db.add(f.fs.FlagSet)
	if sqliteOK {
		f.fs.StringVar(&f.sqlite, "sqlite", "", "SQLite database file, instead of --database")
		f.fs.StringVar(&f.mysql, "mysql", "", mysqlFlagHelp)
	}
	f.fs.StringVar(&f.table, "table", "idem_inbox", "inbox table, optionally schema-qualified")
	f.fs.DurationVar(&f.window, "window", 0, "retention window to remove markers by (default the window stored with the table; a shorter one is refused)")
	f.fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	return f
}

// noWindow refuses --window on a command that only reads or sets the
// stored window: a window of its own would be ignored, or mistaken for the
// one consumers use.
func (f *inboxFlags) noWindow() error {
	if f.window != 0 {
		return f.fs.usagef("this command uses the window stored with the table (see idem inbox window show); --window applies to prune and partitions drop")
	}
	return nil
}

// parse parses args (flags only) and validates the shared flags.
func (f *inboxFlags) parse(args []string) error {
	if err := f.fs.parse(args, false); err != nil {
		return err
	}
	return f.validate()
}

func (f *inboxFlags) validate() error {
	if f.window < 0 {
		return f.fs.usagef("--window must be positive")
	}
	if f.sqlite != "" && f.db.database != "" {
		return f.fs.usagef("--sqlite and --database name two databases: give one")
	}
	if f.mysql != "" && f.db.database != "" {
		return f.fs.usagef("--mysql and --database name two databases: give one")
	}
	if f.mysql != "" && f.sqlite != "" {
		return f.fs.usagef("--mysql and --sqlite name two databases: give one")
	}
	if looksLikeMySQL(f.db.database) {
		return f.fs.usagef("--database takes a PostgreSQL URL; for MySQL or MariaDB give the DSN with --mysql (%s)", mysqlForm)
	}
	if f.mysql != "" {
		if _, err := checkMySQL(f.mysql); err != nil {
			return f.fs.usagef("%s", err)
		}
		if strings.Contains(f.table, ".") {
			return f.fs.usagef("--table %q: MySQL tables take no schema (the DSN names the database)", f.table)
		}
	}
	if f.table == "" {
		return f.fs.usagef("--table must not be empty")
	}
	if !tableName.MatchString(f.table) {
		return f.fs.usagef("--table %q: want a table name, optionally schema.table, of letters, digits and _ (starting with a letter or _)", f.table)
	}
	if f.sqlite != "" && strings.Contains(f.table, ".") {
		return f.fs.usagef("--table %q: SQLite tables take no schema", f.table)
	}
	return f.db.validate()
}

// pgStore opens the PostgreSQL inbox named by the flags, in the layout the
// table has in the database, and checks that the table is an idem inbox.
func (f *inboxFlags) pgStore(ctx context.Context) (*pgxinbox.Store, func(), error) {
	pool, err := f.db.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	var kind *string
	if err := pool.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))`, f.table).Scan(&kind); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("looking up table %s: %w", f.table, err)
	}
	if kind == nil {
		pool.Close()
		return nil, nil, fmt.Errorf("table %s does not exist in this database (wrong --table or --database?); create it with: %s", f.table, f.migrateHint())
	}
	layout := pgxinbox.Plain
	if *kind == "p" {
		layout = pgxinbox.Partitioned
	}
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Table: f.table, Layout: layout, Logger: f.logger})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	if err := f.requireInbox(ctx, store); err != nil {
		pool.Close()
		return nil, nil, err
	}
	return store, pool.Close, nil
}

// settingsReader is what requireInbox needs of either store.
type settingsReader interface {
	Settings(ctx context.Context) (idemstore.Settings, error)
	Check(ctx context.Context) ([]idemstore.SchemaProblem, error)
}

// requireInbox refuses a table that is not an idem inbox (no settings
// stored with it) in one line that says how to make it one, before a
// command reads columns the table does not have: migrate, for a table
// shaped like an inbox of some version; another table, for one that is
// not (migrate would refuse it).
func (f *inboxFlags) requireInbox(ctx context.Context, store settingsReader) error {
	_, err := store.Settings(ctx)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, idem.ErrConfig), errors.As(err, &pgErr) && pgErr.Code == "42P01", isSQLiteNoTable(err), isMySQLNoTable(err):
		// 42P01: the settings table beside it does not exist either.
		if probs, cerr := store.Check(ctx); cerr == nil {
			for _, p := range probs {
				if strings.Contains(p.What, notInboxWords) {
					return errors.New(notInboxLine(p.What))
				}
			}
		}
		return fmt.Errorf("table %s is not an idem inbox (no stored settings); create it with: %s", f.table, f.migrateHint())
	default:
		return fmt.Errorf("reading the settings of inbox table %s: %w", f.table, err)
	}
}

// notInboxWords are the words of a schema problem, and of the migration's
// refusal, that mean the table is not an inbox of any version.
const notInboxWords = " exists and is not an idem inbox"

// notInboxLine is the command line's one line for a table that is not an
// inbox of any version, from what the library says it is ("table t
// exists and is not an idem inbox (it has no column …)").
func notInboxLine(what string) string {
	return what + ": name another table with --table, or rename it aside"
}

// isSQLiteNoTable reports SQLite's "no such table", which has no code of
// its own (SQLITE_ERROR).
func isSQLiteNoTable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such table")
}

// migrateHint is the command that makes the flags' table an inbox.
func (f *inboxFlags) migrateHint() string {
	hint := "idem inbox migrate --table " + f.table
	if f.sqlite != "" {
		hint += " --sqlite " + f.sqlite
	}
	if f.mysql != "" {
		hint += " --mysql '<DSN>'"
	}
	return hint
}

func (f *inboxFlags) sqliteStore(ctx context.Context) (*sqlinbox.Store, func(), error) {
	if _, err := os.Stat(f.sqlite); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("SQLite file %s does not exist (wrong --sqlite?); create the inbox with: %s", f.sqlite, f.migrateHint())
		}
		return nil, nil, fmt.Errorf("opening SQLite file %s: %w", f.sqlite, err)
	}
	db, err := openSQLite(ctx, f.sqlite)
	if err != nil {
		return nil, nil, err
	}
	store, err := sqlinbox.New(db, sqlinbox.SQLite, &sqlinbox.Config{Table: f.table, Logger: f.logger})
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	if err := f.requireInbox(ctx, store); err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return store, func() { _ = db.Close() }, nil
}

func inboxPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("prune", "Deletes markers past the window in batches, each its own short transaction (plain\ntable), or drops the daily partitions past it (partitioned table). One instance prunes\na table at a time; another finds it busy, says so and exits 0.", stdout, stderr, true)
	batch := f.fs.Int("batch", retention.DefaultBatchSize, "markers per delete transaction")
	dryRun := f.fs.Bool("dry-run", false, "count what would go; change nothing")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := f.fs.positive("batch", *batch); err != nil {
		return err
	}
	opts := retention.Options{Window: f.window, BatchSize: *batch, DryRun: *dryRun}
	var res retention.Result
	var table string
	partitioned := false
	if f.sqlite != "" || f.mysql != "" {
		store, closeDB, err := f.sqlStore(ctx)
		if err != nil {
			return err
		}
		defer closeDB()
		table = store.Table()
		if res, err = store.Prune(ctx, opts); err != nil {
			return err
		}
	} else {
		store, closeDB, err := f.pgStore(ctx)
		if err != nil {
			return err
		}
		defer closeDB()
		table = f.table
		partitioned = store.Layout() == pgxinbox.Partitioned
		if res, err = store.Prune(ctx, opts); err != nil {
			return err
		}
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{
			"table": table, "cutoff": res.Cutoff, "markers": res.Markers, "batches": res.Batches,
			"partitions": res.Partitions, "skipped": res.Skipped, "dry_run": res.DryRun,
		})
	}
	switch {
	case res.Skipped:
		_, err := fmt.Fprintf(stdout, "%s: another instance is pruning; skipped\n", table)
		return err
	case partitioned:
		return printDropped(stdout, table, res)
	}
	_, err := fmt.Fprintln(stdout, pruneLine(table, res, *batch))
	return err
}

// pruneLine says what a plain table's prune did, or would do, in plain words.
func pruneLine(table string, res retention.Result, batch int) string {
	cutoff := res.Cutoff.UTC().Format(time.RFC3339)
	switch {
	case res.DryRun && res.Markers == 0:
		return fmt.Sprintf("%s: dry run: nothing to delete, no markers older than %s", table, cutoff)
	case res.DryRun:
		return fmt.Sprintf("%s: dry run: would delete %d markers older than %s, in batches of %d; nothing deleted", table, res.Markers, cutoff, batch)
	case res.Markers == 0:
		return fmt.Sprintf("%s: nothing to delete, no markers older than %s", table, cutoff)
	default:
		return fmt.Sprintf("%s: deleted %d markers older than %s, in %d transactions", table, res.Markers, cutoff, res.Batches)
	}
}

func inboxEnsure(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("partitions ensure", "Creates the daily partitions (UTC) from --from for --days days, skipping those that\nexist. Run it daily so claims always find today's and the next days' partitions.", stdout, stderr, false)
	days := f.fs.Int("days", pgxinbox.DefaultDaysAhead+1, "number of days to cover")
	from := f.fs.String("from", "", "first day, YYYY-MM-DD (default today, UTC)")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := f.noWindow(); err != nil {
		return err
	}
	if err := f.fs.positive("days", *days); err != nil {
		return err
	}
	start := time.Now().UTC()
	if *from != "" {
		var err error
		if start, err = time.Parse(time.DateOnly, *from); err != nil {
			return f.fs.usagef("--from %q: want a day as YYYY-MM-DD", *from)
		}
	}
	store, closeDB, err := f.pgStore(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	created, err := store.EnsurePartitions(ctx, start, *days)
	if err != nil {
		return err
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"table": f.table, "created": created})
	}
	_, err = fmt.Fprintf(stdout, "%s: created %d partitions %s\n", f.table, len(created), strings.Join(created, " "))
	return err
}

func inboxDrop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("partitions drop", "Drops the daily partitions whose every event time is older than the window.", stdout, stderr, false)
	dryRun := f.fs.Bool("dry-run", false, "name what would go; change nothing")
	if err := f.parse(args); err != nil {
		return err
	}
	store, closeDB, err := f.pgStore(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	if store.Layout() != pgxinbox.Partitioned {
		return fmt.Errorf("table %s is not partitioned: use idem inbox prune", f.table)
	}
	res, err := store.Prune(ctx, retention.Options{Window: f.window, DryRun: *dryRun})
	if err != nil {
		return err
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"table": f.table, "cutoff": res.Cutoff, "dropped": res.Partitions, "dry_run": res.DryRun})
	}
	return printDropped(stdout, f.table, res)
}

func printDropped(w io.Writer, table string, res retention.Result) error {
	cutoff := res.Cutoff.UTC().Format(time.RFC3339)
	var err error
	switch {
	case len(res.Partitions) == 0 && res.DryRun:
		_, err = fmt.Fprintf(w, "%s: dry run: nothing to drop, no partitions entirely older than %s\n", table, cutoff)
	case len(res.Partitions) == 0:
		_, err = fmt.Fprintf(w, "%s: nothing to drop, no partitions entirely older than %s\n", table, cutoff)
	case res.DryRun:
		_, err = fmt.Fprintf(w, "%s: dry run: would drop %d partitions older than %s: %s; nothing dropped\n", table, len(res.Partitions), cutoff, strings.Join(res.Partitions, " "))
	default:
		_, err = fmt.Fprintf(w, "%s: dropped %d partitions older than %s: %s\n", table, len(res.Partitions), cutoff, strings.Join(res.Partitions, " "))
	}
	return err
}

func inboxStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("stats", "Reads rows, the oldest marker and the window headroom: how long until the oldest\nmarker may be pruned (negative: the prune is late by that much). Scans the table once.", stdout, stderr, true)
	if err := f.parse(args); err != nil {
		return err
	}
	if err := f.noWindow(); err != nil {
		return err
	}
	var st retention.Stats
	layout := "plain"
	if f.sqlite != "" || f.mysql != "" {
		store, closeDB, err := f.sqlStore(ctx)
		if err != nil {
			return err
		}
		defer closeDB()
		if st, err = store.Stats(ctx); err != nil {
			return err
		}
	} else {
		store, closeDB, err := f.pgStore(ctx)
		if err != nil {
			return err
		}
		defer closeDB()
		layout = store.Layout().String()
		if st, err = store.Stats(ctx); err != nil {
			return err
		}
		st.Table = f.table
	}
	if f.jsonOut {
		out := map[string]any{
			"table": st.Table, "layout": layout, "rows": st.Rows, "no_event_time": st.NoEventTime,
			"oldest": nil, "oldest_age_seconds": st.OldestAge.Seconds(), "window_seconds": st.Window.Seconds(),
			"headroom_seconds": st.Headroom.Seconds(), "prunable": st.Prunable, "partitions": st.Partitions, "now": st.Now,
		}
		if !st.Oldest.IsZero() {
			out["oldest"] = st.Oldest
		}
		return printJSON(stdout, out)
	}
	oldest := "none"
	if !st.Oldest.IsZero() {
		oldest = fmt.Sprintf("%s (%s ago)", st.Oldest.UTC().Format(time.RFC3339), st.OldestAge.Round(time.Second))
	}
	_, err := fmt.Fprintf(stdout, "table      %s (%s)\nrows       %d (%d without event time)\noldest     %s\nwindow     %s\nheadroom   %s\nprunable   %d\n",
		st.Table, layout, st.Rows, st.NoEventTime, oldest, st.Window, st.Headroom.Round(time.Second), st.Prunable)
	if err == nil && len(st.Partitions) > 0 {
		_, err = fmt.Fprintf(stdout, "partitions %d: %s … %s\n", len(st.Partitions), st.Partitions[0], st.Partitions[len(st.Partitions)-1])
	}
	return err
}

// windowStore is what the window commands need of either store.
type windowStore interface {
	Table() string
	Layout() idemstore.Layout
	Settings(ctx context.Context) (idemstore.Settings, error)
	SetWindow(ctx context.Context, w time.Duration, force bool) (time.Duration, error)
	WindowStatus(ctx context.Context) (stored, guard time.Duration, err error)
	Horizons(ctx context.Context) ([]retention.RecordedHorizon, error)
}

// openWindowStore opens the store the flags name, for the window commands.
func (f *inboxFlags) openWindowStore(ctx context.Context) (windowStore, string, func(), error) {
	if f.sqlite != "" || f.mysql != "" {
		s, closeDB, err := f.sqlStore(ctx)
		if err != nil {
			return nil, "", nil, err
		}
		return s, s.Table(), closeDB, nil
	}
	s, closeDB, err := f.pgStore(ctx)
	if err != nil {
		return nil, "", nil, err
	}
	return s, f.table, closeDB, nil
}

func inboxWindowShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("window show", "Prints the layout and retention window stored with the inbox table, and the horizon\neach consumer last recorded (longest first).", stdout, stderr, true)
	if err := f.parse(args); err != nil {
		return err
	}
	if err := f.noWindow(); err != nil {
		return err
	}
	store, table, closeDB, err := f.openWindowStore(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	set, err := store.Settings(ctx)
	if err != nil {
		return err
	}
	window, guard, err := store.WindowStatus(ctx)
	if err != nil {
		return err
	}
	hs, err := store.Horizons(ctx)
	if err != nil {
		return err
	}
	if f.jsonOut {
		horizons := make([]map[string]any, len(hs))
		for i, h := range hs {
			horizons[i] = map[string]any{"consumer": h.Consumer, "horizon_seconds": h.Window.Seconds(), "seen_at": h.SeenAt}
		}
		return printJSON(stdout, map[string]any{"table": table, "layout": set.Layout.String(), "window_seconds": window.Seconds(),
			"guard_window_seconds": guard.Seconds(), "horizons": horizons})
	}
	if _, err := fmt.Fprintf(stdout, "table    %s (%s)\nwindow   %s\n", table, set.Layout, window); err != nil {
		return err
	}
	if guard < window {
		// After a lengthening, markers older than the old window may be
		// gone: consumers may guard with more only as time passes.
		if _, err := fmt.Fprintf(stdout, "guard    %s (grows to the window in %s)\n", guard.Round(time.Second), (window - guard).Round(time.Second)); err != nil {
			return err
		}
	}
	for _, h := range hs {
		if _, err := fmt.Fprintf(stdout, "horizon  %s %s (recorded %s)\n", h.Consumer, h.Window, h.SeenAt.UTC().Format(time.RFC3339)); err != nil {
			return err
		}
	}
	return nil
}

func inboxWindowSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("window set <duration>", "Changes the retention window stored with the inbox table, which every consumer, prune\nand command reads, and logs the old and new values. A window under 1h, or shorter than\nthe horizon a consumer recorded, is refused unless --force. Markers older than the old\nwindow may already be gone: after lengthening, wait the difference before a consumer\nguards with the new window.", stdout, stderr, true)
	force := f.fs.Bool("force", false, "set a window under 1h or below a consumer's horizon anyway")
	// The duration may come before or after the flags.
	var dur string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		dur, args = args[0], args[1:]
	}
	if err := f.fs.parse(args, true); err != nil {
		return err
	}
	rest := f.fs.Args()
	if dur == "" && len(rest) > 0 {
		dur = rest[0]
		if err := f.fs.parse(rest[1:], true); err != nil {
			return err
		}
		rest = f.fs.Args()
	}
	if len(rest) > 0 {
		return f.fs.usagef("unexpected arguments: %s", strings.Join(rest, " "))
	}
	if err := f.validate(); err != nil {
		return err
	}
	if err := f.noWindow(); err != nil {
		return err
	}
	if dur == "" {
		return f.fs.usagef("want the new window, such as: idem inbox window set 720h")
	}
	w, err := time.ParseDuration(dur)
	if err != nil || w <= 0 {
		return f.fs.usagef("%q is not a positive duration (such as 720h)", dur)
	}
	store, table, closeDB, err := f.openWindowStore(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	old, err := store.SetWindow(ctx, w, *force)
	if err != nil {
		if !*force && strings.Contains(err.Error(), "force it") {
			return fmt.Errorf("%w (to set it anyway: idem inbox window set %s --force)", err, dur)
		}
		return err
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"table": table, "old_window_seconds": old.Seconds(), "window_seconds": w.Seconds(), "forced": *force})
	}
	_, err = fmt.Fprintf(stdout, "%s: window %s -> %s\n", table, old, w)
	return err
}

func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func inboxMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("migrate", "Creates the inbox table, or upgrades it to this build's schema, and records its layout and\nretention window beside it. Safe to run on every deploy and from several instances at once.\nA new table gets --window (default 14 days); an existing one keeps its stored window (change\nit with: idem inbox window set). Consumers refuse to start on a table that was not migrated.", stdout, stderr, true)
	f.fs.Lookup("window").Usage = "retention window recorded for a new table (an existing table keeps its stored window; change it with: idem inbox window set)"
	layout := f.fs.String("layout", "plain", "layout of a new table: plain or partitioned (PostgreSQL); an existing table keeps the layout it has")
	if err := f.parse(args); err != nil {
		return err
	}
	layoutGiven := false
	f.fs.Visit(func(fl *flag.Flag) { layoutGiven = layoutGiven || fl.Name == "layout" })
	var l pgxinbox.Layout
	switch *layout {
	case "plain":
		l = pgxinbox.Plain
	case "partitioned":
		l = pgxinbox.Partitioned
	default:
		return f.fs.usagef("--layout %q: want plain or partitioned", *layout)
	}
	var rep idemstore.MigrateReport
	if f.mysql != "" {
		if l != pgxinbox.Plain {
			return f.fs.usagef("--layout partitioned is for PostgreSQL; MySQL and MariaDB inboxes have the plain layout")
		}
		db, err := openMySQL(ctx, f.mysql, &f.db)
		if err != nil {
			return err
		}
		defer db.Close()
		store, err := mysqlinbox.New(db, &sqlinbox.Config{Table: f.table, Window: f.window, Logger: f.logger})
		if err != nil {
			return err
		}
		if rep, err = store.MigrateReport(ctx); err != nil {
			return migrateError(err)
		}
	} else if f.sqlite != "" {
		if l != pgxinbox.Plain {
			return f.fs.usagef("--layout partitioned is for PostgreSQL; SQLite inboxes have the plain layout")
		}
		db, err := openSQLite(ctx, f.sqlite)
		if err != nil {
			return err
		}
		defer db.Close()
		store, err := sqlinbox.New(db, sqlinbox.SQLite, &sqlinbox.Config{Table: f.table, Window: f.window, Logger: f.logger})
		if err != nil {
			return err
		}
		if rep, err = store.MigrateReport(ctx); err != nil {
			return migrateError(err)
		}
	} else {
		pool, err := f.db.pool(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		// --layout is the layout of a new table: an existing one keeps its
		// own, so that the same command runs on every deploy.
		has, err := f.existingLayout(ctx, pool)
		if err != nil {
			return err
		}
		if has != nil && *has != l {
			if layoutGiven {
				return f.fs.usagef("table %s has the %s layout; --layout %s applies only to a new table", f.table, *has, *layout)
			}
			l = *has
		}
		store, err := pgxinbox.New(pool, &pgxinbox.Config{Table: f.table, Layout: l, Window: f.window, Logger: f.logger})
		if err != nil {
			return err
		}
		if rep, err = store.MigrateReport(ctx); err != nil {
			return migrateError(err)
		}
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"table": rep.Table, "layout": rep.Layout.String(), "window": rep.Window.String(),
			"created": rep.Created, "from": rep.From, "to": rep.To, "partitions": rep.Partitions})
	}
	_, err := fmt.Fprintln(stdout, rep.String())
	return err
}

// existingLayout is the layout of the flags' PostgreSQL table: the one
// stored in its settings, else (a table migrated by hand, without them)
// the one it has; nil when the table does not exist, or is not a table.
func (f *inboxFlags) existingLayout(ctx context.Context, pool *pgxpool.Pool) (*pgxinbox.Layout, error) {
	var kind *string
	if err := pool.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))`, f.table).Scan(&kind); err != nil {
		return nil, fmt.Errorf("looking up table %s: %w", f.table, err)
	}
	var l pgxinbox.Layout
	switch {
	case kind == nil:
		return nil, nil
	case *kind == "r":
		l = pgxinbox.Plain
	case *kind == "p":
		l = pgxinbox.Partitioned
	default:
		return nil, nil // migrate says what it is
	}
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Table: f.table, Layout: l, Logger: f.logger})
	if err != nil {
		return nil, err
	}
	if set, err := store.Settings(ctx); err == nil {
		l = set.Layout
	}
	return &l, nil
}

// migrateError is a failed migration in one line: a table that is not an
// inbox, or of another layout, in the command line's terms.
func migrateError(err error) error {
	var notInbox *inboxdb.NotInboxError
	if errors.As(err, &notInbox) {
		return errors.New(notInboxLine(notInbox.What()))
	}
	var layout *inboxdb.LayoutError
	if errors.As(err, &layout) {
		return fmt.Errorf("table %s has the %s layout; --layout %s applies only to a new table", layout.Table, layout.Has, layout.Want)
	}
	return err
}

// mysqlFlagHelp documents a --mysql flag.
const mysqlFlagHelp = "MySQL or MariaDB database, as the Go driver's DSN user:password@tcp(host:3306)/database (the form mysqlinbox.Open takes), instead of --database"

// mysqlForm is the form a --mysql value takes, for error messages.
const mysqlForm = "user:password@tcp(host:3306)/database"

// looksLikeMySQL reports whether a --database value is a MySQL DSN or URL,
// so that the refusal can name --mysql.
func looksLikeMySQL(v string) bool {
	return strings.HasPrefix(v, "mysql://") || strings.HasPrefix(v, "mariadb://") || strings.Contains(v, "@tcp(") || strings.Contains(v, "@unix(")
}

// checkMySQL validates a --mysql value: the driver's DSN naming a
// database. A URL (mysql://, postgres://) is refused with the form wanted.
func checkMySQL(v string) (*mysql.Config, error) {
	switch {
	case strings.HasPrefix(v, "postgres://"), strings.HasPrefix(v, "postgresql://"):
		return nil, fmt.Errorf("--mysql %s is a PostgreSQL URL: give it with --database", redactURL(v))
	case strings.Contains(v, "://"):
		return nil, fmt.Errorf("--mysql takes the MySQL driver's DSN, not a URL: %s (such as root@tcp(127.0.0.1:3306)/test)", mysqlForm)
	}
	cfg, err := mysql.ParseDSN(v)
	if err != nil {
		return nil, fmt.Errorf("--mysql is not a MySQL DSN (want %s): %s", mysqlForm, strings.TrimPrefix(err.Error(), "invalid DSN: "))
	}
	if cfg.DBName == "" {
		return nil, fmt.Errorf("--mysql names no database: want %s", mysqlForm)
	}
	return cfg, nil
}

// mysqlWhere names a --mysql database without its password.
func mysqlWhere(cfg *mysql.Config) string {
	return fmt.Sprintf("MySQL %s@%s/%s", cfg.User, cfg.Addr, cfg.DBName)
}

// openMySQL opens the --mysql database for a command, with the session
// options of mysqlinbox.Config. Dialing is bounded by --connect-timeout
// (a timeout in the DSN is kept unless the flag is given); reads and writes
// are not bounded unless the DSN says so (readTimeout, writeTimeout): a
// command's statements (an index build, a scan of a large table) may run
// long, as the PostgreSQL commands set no statement timeout either.
func openMySQL(ctx context.Context, dsn string, d *dbFlags) (*sql.DB, error) {
	parsed, err := checkMySQL(dsn)
	if err != nil {
		return nil, usagef("%s", err)
	}
	cfg, err := mysqlinbox.Config(dsn)
	if err != nil {
		return nil, usagef("--mysql is not a MySQL DSN (want %s)", mysqlForm)
	}
	if cfg.ReadTimeout == mysqlinbox.DefaultReadTimeout && parsed.ReadTimeout == 0 {
		cfg.ReadTimeout = 0
	}
	if cfg.WriteTimeout == mysqlinbox.DefaultWriteTimeout && parsed.WriteTimeout == 0 {
		cfg.WriteTimeout = 0
	}
	source := "--connect-timeout"
	if d.timeoutGiven() || parsed.Timeout == 0 {
		cfg.Timeout = d.connectTimeout
	} else {
		source = "timeout in --mysql"
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, usagef("--mysql: %v", err)
	}
	db := sql.OpenDB(conn)
	pingCtx := ctx
	if cfg.Timeout > 0 {
		// The driver's timeout bounds the dial; a server that accepts and
		// then says nothing is bounded here.
		var cancel context.CancelFunc
		pingCtx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	if err := db.PingContext(pingCtx); err != nil {
		_ = db.Close()
		var netErr net.Error
		if ctx.Err() == nil && cfg.Timeout > 0 && (errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout()) {
			return nil, fmt.Errorf("connecting to %s: no answer within %s (%s): the server is unreachable or not answering", mysqlWhere(cfg), cfg.Timeout, source)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connecting to %s: %w", mysqlWhere(cfg), ctx.Err())
		}
		return nil, fmt.Errorf("connecting to %s: %w", mysqlWhere(cfg), err)
	}
	noteDatabase(ctx, mysqlWhere(cfg))
	return db, nil
}

// isMySQLNoTable reports MySQL's "table doesn't exist" (1146).
func isMySQLNoTable(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1146
}

// mysqlStore opens the --mysql inbox named by the flags, with the dialect
// of the server (MySQL or MariaDB), and checks that the table is an idem
// inbox.
func (f *inboxFlags) mysqlStore(ctx context.Context) (*sqlinbox.Store, func(), error) {
	db, err := openMySQL(ctx, f.mysql, &f.db)
	if err != nil {
		return nil, nil, err
	}
	store, err := mysqlinbox.New(db, &sqlinbox.Config{Table: f.table, Logger: f.logger})
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	if err := f.requireInbox(ctx, store); err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return store, func() { _ = db.Close() }, nil
}

// sqlStore opens the --sqlite or --mysql inbox the flags name.
func (f *inboxFlags) sqlStore(ctx context.Context) (*sqlinbox.Store, func(), error) {
	if f.mysql != "" {
		return f.mysqlStore(ctx)
	}
	return f.sqliteStore(ctx)
}
