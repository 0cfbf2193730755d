package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

func init() {
	register(command{name: "inbox", summary: "the inbox table: migrate, prune, partitions ensure|drop, stats, window show|set", run: runInbox})
}

const inboxUsage = `usage: idem inbox <migrate|prune|partitions ensure|partitions drop|stats|window show|window set> [flags]

Markers are kept for the retention window stored with the inbox table (written
by its migration, 14 days by default), counted from a marker's keep_until: the
latest of its write time and the event times of the messages that met it
(partitioned tables: its partition time). Every consumer, prune and command
reads the stored window; a prune or drop with a shorter --window is refused.

  migrate           create or upgrade the inbox table and record its layout and
                    window (run it before the consumers start, and on upgrades)
  prune             delete markers past the window in batches (plain table), or
                    drop the daily partitions past it (partitioned table)
  partitions ensure create daily partitions ahead (run it daily)
  partitions drop   drop the daily partitions past the window
  stats             rows, oldest marker, window headroom (--json)
  window show       the stored layout and window, and the consumers' horizons
  window set <dur>  change the stored window (logged; --force under 1h or
                    below a consumer's horizon)

The layout is read from the database. Run 'idem inbox <subcommand> -h' for flags.
`

func runInbox(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, inboxUsage)
		return &exitError{code: 2}
	}
	switch sub, rest := args[0], args[1:]; sub {
	case "migrate":
		return inboxMigrate(ctx, rest, stdout, stderr)
	case "prune":
		return inboxPrune(ctx, rest, stdout, stderr)
	case "stats":
		return inboxStats(ctx, rest, stdout, stderr)
	case "window":
		return inboxGroup(ctx, "window", rest, stdout, stderr, map[string]inboxCommand{
			"show": inboxWindowShow, "set": inboxWindowSet,
		})
	case "partitions":
		return inboxGroup(ctx, "partitions", rest, stdout, stderr, map[string]inboxCommand{
			"ensure": inboxEnsure, "drop": inboxDrop,
		})
	case "-h", "--help", "help":
		fmt.Fprint(stderr, inboxUsage)
		return nil
	default:
		fmt.Fprintf(stderr, "idem inbox: unknown subcommand %q\n\n%s", sub, inboxUsage)
		return &exitError{code: 2}
	}
}

// inboxCommand runs one `idem inbox` subcommand with its arguments.
type inboxCommand func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// inboxGroup runs the subcommand of a group (`idem inbox window show`)
// named by rest[0].
func inboxGroup(ctx context.Context, group string, rest []string, stdout, stderr io.Writer, cmds map[string]inboxCommand) error {
	if len(rest) == 0 {
		fmt.Fprint(stderr, inboxUsage)
		return &exitError{code: 2}
	}
	if cmd, ok := cmds[rest[0]]; ok {
		return cmd(ctx, rest[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "idem inbox %s: unknown subcommand %q\n\n%s", group, rest[0], inboxUsage)
	return &exitError{code: 2}
}

// inboxFlags are the flags every inbox subcommand shares.
type inboxFlags struct {
	fs       *flag.FlagSet
	database string
	sqlite   string
	table    string
	window   time.Duration
	jsonOut  bool
	logger   *slog.Logger
}

func newInboxFlags(name, doc string, stderr io.Writer, sqliteOK bool) *inboxFlags {
	f := &inboxFlags{fs: flag.NewFlagSet("idem inbox "+name, flag.ContinueOnError), logger: slog.New(slog.NewTextHandler(stderr, nil))}
	f.fs.SetOutput(stderr)
	f.fs.StringVar(&f.database, "database", "", databaseFlagHelp)
	if sqliteOK {
		f.fs.StringVar(&f.sqlite, "sqlite", "", "SQLite database file, instead of --database")
	}
	f.fs.StringVar(&f.table, "table", "idem_inbox", "inbox table, optionally schema-qualified")
	f.fs.DurationVar(&f.window, "window", 0, "retention window to remove markers by (default the window stored with the table; a shorter one is refused)")
	f.fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	f.fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: idem inbox %s [flags]\n\n%s\n\nflags:\n", name, doc)
		f.fs.PrintDefaults()
	}
	return f
}

// noWindow refuses --window on a command that only reads or sets the
// stored window: a window of its own would be ignored, or mistaken for the
// one consumers use.
func (f *inboxFlags) noWindow(cmd string) error {
	if f.window != 0 {
		return &exitError{code: 2, msg: cmd + " uses the window stored with the table (see idem inbox window show); --window applies to prune and partitions drop"}
	}
	return nil
}

func (f *inboxFlags) parse(args []string) error {
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	if f.fs.NArg() > 0 {
		return &exitError{code: 2, msg: "unexpected arguments: " + strings.Join(f.fs.Args(), " ")}
	}
	if f.window < 0 {
		return &exitError{code: 2, msg: "--window must be positive"}
	}
	return nil
}

// pgStore opens the PostgreSQL inbox named by the flags, in the layout the
// table has in the database.
func (f *inboxFlags) pgStore(ctx context.Context) (*pgxinbox.Store, func(), error) {
	pool, err := pgxpool.New(ctx, databaseURL(f.database))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	var kind *string
	if err := pool.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))`, f.table).Scan(&kind); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("looking up table %s: %w", f.table, err)
	}
	if kind == nil {
		pool.Close()
		return nil, nil, fmt.Errorf("table %s does not exist in this database (wrong --table or --database?)", f.table)
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
	return store, pool.Close, nil
}

func (f *inboxFlags) sqliteStore() (*sqlinbox.Store, func(), error) {
	if _, err := os.Stat(f.sqlite); err != nil {
		return nil, nil, fmt.Errorf("opening SQLite inbox: %w", err)
	}
	db, err := sqliteinbox.Open(f.sqlite)
	if err != nil {
		return nil, nil, err
	}
	store, err := sqlinbox.New(db, sqlinbox.SQLite, &sqlinbox.Config{Table: f.table, Logger: f.logger})
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return store, func() { _ = db.Close() }, nil
}

func inboxPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("prune", "Deletes markers past the window in batches, each its own short transaction (plain\ntable), or drops the daily partitions past it (partitioned table). One instance prunes\na table at a time; another finds it busy, says so and exits 0.", stderr, true)
	batch := f.fs.Int("batch", retention.DefaultBatchSize, "markers per delete transaction")
	dryRun := f.fs.Bool("dry-run", false, "count what would go; change nothing")
	if err := f.parse(args); err != nil {
		return err
	}
	if *batch < 1 {
		return &exitError{code: 2, msg: "--batch must be at least 1"}
	}
	opts := retention.Options{Window: f.window, BatchSize: *batch, DryRun: *dryRun}
	var res retention.Result
	var table string
	partitioned := false
	if f.sqlite != "" {
		store, closeDB, err := f.sqliteStore()
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
	verb := "deleted"
	if res.DryRun {
		verb = "would delete"
	}
	_, err := fmt.Fprintf(stdout, "%s: %s %d markers older than %s (%d batches)\n", table, verb, res.Markers,
		res.Cutoff.UTC().Format(time.RFC3339), res.Batches)
	return err
}

func inboxEnsure(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("partitions ensure", "Creates the daily partitions (UTC) from --from for --days days, skipping those that\nexist. Run it daily so claims always find today's and the next days' partitions.", stderr, false)
	days := f.fs.Int("days", pgxinbox.DefaultDaysAhead+1, "number of days to cover")
	from := f.fs.String("from", "", "first day, YYYY-MM-DD (default today, UTC)")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := f.noWindow("partitions ensure"); err != nil {
		return err
	}
	start := time.Now().UTC()
	if *from != "" {
		var err error
		if start, err = time.Parse(time.DateOnly, *from); err != nil {
			return &exitError{code: 2, msg: "--from: want YYYY-MM-DD"}
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
	f := newInboxFlags("partitions drop", "Drops the daily partitions whose every event time is older than the window.", stderr, false)
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
	verb := "dropped"
	if res.DryRun {
		verb = "would drop"
	}
	_, err := fmt.Fprintf(w, "%s: %s %d partitions older than %s: %s\n", table, verb, len(res.Partitions),
		res.Cutoff.UTC().Format(time.RFC3339), strings.Join(res.Partitions, " "))
	return err
}

func inboxStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("stats", "Reads rows, the oldest marker and the window headroom: how long until the oldest\nmarker may be pruned (negative: the prune is late by that much). Scans the table once.", stderr, true)
	if err := f.parse(args); err != nil {
		return err
	}
	if err := f.noWindow("stats"); err != nil {
		return err
	}
	var st retention.Stats
	layout := "plain"
	if f.sqlite != "" {
		store, closeDB, err := f.sqliteStore()
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
	Layout() idem.Layout
	Settings(ctx context.Context) (idem.Settings, error)
	SetWindow(ctx context.Context, w time.Duration, force bool) (time.Duration, error)
	WindowStatus(ctx context.Context) (stored, guard time.Duration, err error)
	Horizons(ctx context.Context) ([]retention.RecordedHorizon, error)
}

// openWindowStore opens the store the flags name, for the window commands.
func (f *inboxFlags) openWindowStore(ctx context.Context) (windowStore, string, func(), error) {
	if f.sqlite != "" {
		s, closeDB, err := f.sqliteStore()
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
	f := newInboxFlags("window show", "Prints the layout and retention window stored with the inbox table, and the horizon\neach consumer last recorded (longest first).", stderr, true)
	if err := f.parse(args); err != nil {
		return err
	}
	if err := f.noWindow("window show"); err != nil {
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
	f := newInboxFlags("window set <duration>", "Changes the retention window stored with the inbox table, which every consumer, prune\nand command reads, and logs the old and new values. A window under 1h, or shorter than\nthe horizon a consumer recorded, is refused unless --force. Markers older than the old\nwindow may already be gone: after lengthening, wait the difference before a consumer\nguards with the new window.", stderr, true)
	force := f.fs.Bool("force", false, "set a window under 1h or below a consumer's horizon anyway")
	// The duration may come before or after the flags.
	var dur string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		dur, args = args[0], args[1:]
	}
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	rest := f.fs.Args()
	if dur == "" && len(rest) > 0 {
		dur, rest = rest[0], rest[1:]
		if err := f.fs.Parse(rest); err != nil {
			return &exitError{code: 2}
		}
		rest = f.fs.Args()
	}
	if len(rest) > 0 {
		return &exitError{code: 2, msg: "unexpected arguments: " + strings.Join(rest, " ")}
	}
	if err := f.noWindow("window set"); err != nil {
		return err
	}
	if dur == "" {
		return &exitError{code: 2, msg: "window set: want a duration, such as 720h"}
	}
	w, err := time.ParseDuration(dur)
	if err != nil || w <= 0 {
		return &exitError{code: 2, msg: fmt.Sprintf("window set: %q is not a positive duration (such as 720h)", dur)}
	}
	store, table, closeDB, err := f.openWindowStore(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	old, err := store.SetWindow(ctx, w, *force)
	if err != nil {
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
	f := newInboxFlags("migrate", "Creates the inbox table, or upgrades it to this build's schema, and records its layout and\nretention window beside it. Safe to run on every deploy and from several instances at once.\nA new table gets --window (default 14 days); an existing one keeps its stored window (change\nit with: idem inbox window set). Consumers refuse to start on a table that was not migrated.", stderr, true)
	layout := f.fs.String("layout", "plain", "layout of a new table: plain or partitioned (PostgreSQL)")
	if err := f.parse(args); err != nil {
		return err
	}
	var l pgxinbox.Layout
	switch *layout {
	case "plain":
		l = pgxinbox.Plain
	case "partitioned":
		l = pgxinbox.Partitioned
	default:
		return &exitError{code: 2, msg: fmt.Sprintf("--layout %q: want plain or partitioned", *layout)}
	}
	var set idem.Settings
	var table string
	if f.sqlite != "" {
		if l != pgxinbox.Plain {
			return &exitError{code: 2, msg: "SQLite inboxes have the plain layout"}
		}
		db, err := sqliteinbox.Open(f.sqlite)
		if err != nil {
			return err
		}
		defer db.Close()
		store, err := sqlinbox.New(db, sqlinbox.SQLite, &sqlinbox.Config{Table: f.table, Window: f.window, Logger: f.logger})
		if err != nil {
			return err
		}
		if err := store.Migrate(ctx); err != nil {
			return err
		}
		if set, err = store.Settings(ctx); err != nil {
			return err
		}
		table = store.Table()
	} else {
		pool, err := pgxpool.New(ctx, databaseURL(f.database))
		if err != nil {
			return fmt.Errorf("connecting to PostgreSQL: %w", err)
		}
		defer pool.Close()
		store, err := pgxinbox.New(pool, &pgxinbox.Config{Table: f.table, Layout: l, Window: f.window, Logger: f.logger})
		if err != nil {
			return err
		}
		if err := store.Migrate(ctx); err != nil {
			return err
		}
		if set, err = store.Settings(ctx); err != nil {
			return err
		}
		table = f.table
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"table": table, "layout": set.Layout.String(), "window": set.Window.String()})
	}
	_, err := fmt.Fprintf(stdout, "%s: migrated (%s layout, window %v)\n", table, set.Layout, set.Window)
	return err
}
