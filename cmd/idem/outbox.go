package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlinbox"
)

func init() {
	register(command{name: "outbox", summary: "the transactional outbox: stats, retry parked rows, prune sent rows", run: runOutbox})
}

const outboxUsage = `usage: idem outbox <stats|retry|prune|migrate> [flags]

The outbox holds the events producers enqueued in their transactions until a
relay has published them:
  stats    unsent rows and the oldest one's age (the relays' lag), parked and sent rows, per destination
  retry    send parked rows again (the broker refused them MaxAttempts times)
  prune    delete rows sent longer ago than --retention, in batches
  migrate  create the outbox table, or bring it to the newest schema

Run 'idem outbox <subcommand> -h' for its flags.
`

func runOutbox(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, outboxUsage)
		return &usageError{cmd: "outbox", msg: "missing subcommand"}
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "stats":
		return outboxStats(ctx, rest, stdout)
	case "retry":
		return outboxRetry(ctx, rest, stdout)
	case "prune":
		return outboxPrune(ctx, rest, stdout)
	case "migrate":
		return outboxMigrate(ctx, rest, stdout)
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, outboxUsage)
		return nil
	default:
		return &usageError{cmd: "outbox", msg: fmt.Sprintf("unknown subcommand %q (want stats, retry, prune or migrate)", sub)}
	}
}

// outboxOps is what the subcommands use of an outbox of either
// transaction type.
type outboxOps interface {
	Migrate(ctx context.Context) (outbox.MigrateReport, error)
	Stats(ctx context.Context) (outbox.Stats, error)
	Prune(ctx context.Context, opts outbox.PruneOptions) (int64, error)
	Retry(ctx context.Context, f outbox.RetryFilter) (int64, error)
	ParkedRows(ctx context.Context, limit int) ([]outbox.ParkedRow, error)
}

// outboxFlags are the flags every outbox subcommand shares.
type outboxFlags struct {
	fs      *cmdFlags
	db      dbFlags
	sqlite  string
	table   string
	jsonOut bool
}

func newOutboxFlags(name, synopsis, doc string, stdout io.Writer) *outboxFlags {
	f := &outboxFlags{fs: newCmdFlags("outbox "+name, synopsis, doc, stdout)}
	f.db.add(f.fs.FlagSet)
	f.fs.StringVar(&f.sqlite, "sqlite", "", "SQLite database file, instead of --database")
	f.fs.StringVar(&f.table, "table", outbox.DefaultTable, "outbox table, optionally schema-qualified")
	f.fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	return f
}

func (f *outboxFlags) parse(args []string) error {
	if err := f.fs.parse(args, false); err != nil {
		return err
	}
	switch {
	case f.sqlite != "" && f.db.database != "":
		return f.fs.usagef("--sqlite and --database name two databases: give one")
	case f.table == "":
		return f.fs.usagef("--table must not be empty")
	case !tableName.MatchString(f.table):
		return f.fs.usagef("--table %q: want a table name, optionally schema.table, of letters, digits and _ (starting with a letter or _)", f.table)
	case f.sqlite != "" && strings.Contains(f.table, "."):
		return f.fs.usagef("--table %q: SQLite tables take no schema", f.table)
	}
	return f.db.validate()
}

// migrateHint is the command that creates the flags' outbox table.
func (f *outboxFlags) migrateHint() string {
	hint := "idem outbox migrate --table " + f.table
	if f.sqlite != "" {
		hint += " --sqlite " + f.sqlite
	}
	return hint
}

// open opens the outbox the flags name. create allows a SQLite file that
// does not exist yet, and shards is the count of a new table (migrate).
func (f *outboxFlags) open(ctx context.Context, create bool, shards int) (outboxOps, func(), error) {
	cfg := &outbox.Config{Table: f.table, Shards: shards}
	if f.sqlite != "" {
		if _, err := os.Stat(f.sqlite); err != nil && !create {
			if errors.Is(err, os.ErrNotExist) {
				return nil, nil, fmt.Errorf("SQLite file %s does not exist (wrong --sqlite?); create the outbox with: %s", f.sqlite, f.migrateHint())
			}
			return nil, nil, fmt.Errorf("opening SQLite file %s: %w", f.sqlite, err)
		}
		db, err := openSQLite(ctx, f.sqlite)
		if err != nil {
			return nil, nil, err
		}
		o, err := outbox.NewSQL(db, sqlinbox.SQLite, cfg)
		if err != nil {
			_ = db.Close()
			return nil, nil, err
		}
		return o, func() { _ = db.Close() }, nil
	}
	pool, err := f.db.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	o, err := outbox.NewPgx(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return o, pool.Close, nil
}

// explain words a missing table as what to run.
func (f *outboxFlags) explain(err error) error {
	if errors.Is(err, outbox.ErrNoTable) {
		return fmt.Errorf("outbox table %s does not exist in this database (wrong --table or --database?); create it with: %s", f.table, f.migrateHint())
	}
	return err
}

func outboxStats(ctx context.Context, args []string, stdout io.Writer) error {
	f := newOutboxFlags("stats", "[flags]", "Counts the outbox's rows per destination: unsent (committed, not yet confirmed by the\nbroker), the oldest unsent row's age (the relays' lag), parked (refused by the broker\nMaxAttempts times, waiting for idem outbox retry) and sent (kept until prune). Lists up\nto --parked parked rows with the broker's reason. Scans the table once.", stdout)
	limit := f.fs.Int("parked", 10, "parked rows to list (0: none)")
	if err := f.parse(args); err != nil {
		return err
	}
	if *limit < 0 {
		return f.fs.usagef("--parked must not be negative (0: list none)")
	}
	o, closeDB, err := f.open(ctx, false, 0)
	if err != nil {
		return err
	}
	defer closeDB()
	st, err := o.Stats(ctx)
	if err != nil {
		return f.explain(err)
	}
	var parked []outbox.ParkedRow
	if *limit > 0 && st.Parked > 0 {
		if parked, err = o.ParkedRows(ctx, *limit); err != nil {
			return f.explain(err)
		}
	}
	if f.jsonOut {
		dests := make([]map[string]any, 0, len(st.Destinations))
		for _, d := range st.Destinations {
			dests = append(dests, map[string]any{"destination": d.Destination, "unsent": d.Unsent, "oldest_unsent": jsonTime(d.OldestUnsent), "parked": d.Parked, "sent": d.Sent})
		}
		rows := make([]map[string]any, 0, len(parked))
		for _, p := range parked {
			rows = append(rows, map[string]any{"seq": p.Seq, "id": p.ID, "destination": p.Destination, "key": p.Key, "attempts": p.Attempts, "parked_at": p.ParkedAt, "reason": p.Reason})
		}
		return printJSON(stdout, map[string]any{
			"table": f.table, "unsent": st.Unsent, "oldest_unsent": jsonTime(st.OldestUnsent), "oldest_unsent_age_seconds": st.OldestUnsentAge.Seconds(),
			"parked": st.Parked, "sent": st.Sent, "destinations": dests, "parked_rows": rows,
		})
	}
	lag := "none unsent"
	if !st.OldestUnsent.IsZero() {
		lag = fmt.Sprintf("%s (%s ago)", st.OldestUnsent.UTC().Format(time.RFC3339), st.OldestUnsentAge.Round(time.Millisecond))
	}
	fmt.Fprintf(stdout, "table          %s\nunsent         %d\noldest unsent  %s\nparked         %d\nsent           %d\n", f.table, st.Unsent, lag, st.Parked, st.Sent)
	if len(st.Destinations) > 0 {
		fmt.Fprintln(stdout)
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "DESTINATION\tUNSENT\tPARKED\tSENT")
		for _, d := range st.Destinations {
			fmt.Fprintf(w, "%s\t%d\t%d\t%d\n", destinationName(d.Destination), d.Unsent, d.Parked, d.Sent)
		}
		_ = w.Flush()
	}
	if len(parked) > 0 {
		fmt.Fprintf(stdout, "\nparked rows (oldest first; send them again with idem outbox retry):\n")
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tDESTINATION\tKEY\tATTEMPTS\tPARKED AT\tREASON")
		for _, p := range parked {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", p.ID, destinationName(p.Destination), p.Key, p.Attempts, p.ParkedAt.UTC().Format(time.RFC3339), p.Reason)
		}
		_ = w.Flush()
	}
	return nil
}

// destinationName shows RabbitMQ's default exchange, whose name is empty.
func destinationName(d string) string {
	if d == "" {
		return "(default exchange)"
	}
	return d
}

// jsonTime is t, or null when zero.
func jsonTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

func outboxRetry(ctx context.Context, args []string, stdout io.Writer) error {
	f := newOutboxFlags("retry", "(--id ID | --destination D | --key K | --all) [flags]", "Un-parks parked rows: their attempts start again from zero and the relays send them\non their next pass. Select rows with --id, --destination and --key (all given must\nmatch), or every parked row with --all. Fix what made the broker refuse them first\n(a missing exchange or topic, a size limit), or they are parked again.", stdout)
	var filter outbox.RetryFilter
	f.fs.StringVar(&filter.ID, "id", "", "the message ID of one parked row")
	f.fs.StringVar(&filter.Destination, "destination", "", "parked rows of this destination (topic or exchange)")
	f.fs.StringVar(&filter.Key, "key", "", "parked rows of this ordering key")
	all := f.fs.Bool("all", false, "every parked row")
	if err := f.parse(args); err != nil {
		return err
	}
	none := filter == (outbox.RetryFilter{})
	switch {
	case none && !*all:
		return f.fs.usagef("say which parked rows to send again: --id, --destination, --key, or --all for every one")
	case !none && *all:
		return f.fs.usagef("--all selects every parked row: give it without --id, --destination or --key")
	}
	o, closeDB, err := f.open(ctx, false, 0)
	if err != nil {
		return err
	}
	defer closeDB()
	n, err := o.Retry(ctx, filter)
	if err != nil {
		return f.explain(err)
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"table": f.table, "retried": n})
	}
	if n == 0 {
		_, err = fmt.Fprintf(stdout, "no parked row of %s matches; nothing to retry\n", f.table)
		return err
	}
	_, err = fmt.Fprintf(stdout, "retried %d parked rows of %s: the relays send them on their next pass\n", n, f.table)
	return err
}

func outboxPrune(ctx context.Context, args []string, stdout io.Writer) error {
	f := newOutboxFlags("prune", "[flags]", "Deletes the rows sent longer ago than --retention, in batches each its own short\ntransaction. Unsent and parked rows are never deleted.", stdout)
	retention := f.fs.Duration("retention", outbox.DefaultRetention, "keep sent rows this long after they were sent")
	batch := f.fs.Int("batch", 1000, "rows per delete transaction")
	dryRun := f.fs.Bool("dry-run", false, "count what would go; change nothing")
	if err := f.parse(args); err != nil {
		return err
	}
	if *retention <= 0 {
		return f.fs.usagef("--retention must be positive")
	}
	if err := f.fs.positive("batch", *batch); err != nil {
		return err
	}
	o, closeDB, err := f.open(ctx, false, 0)
	if err != nil {
		return err
	}
	defer closeDB()
	n, err := o.Prune(ctx, outbox.PruneOptions{Retention: *retention, BatchSize: *batch, DryRun: *dryRun})
	if err != nil {
		return f.explain(err)
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"table": f.table, "deleted": n, "dry_run": *dryRun, "retention_seconds": retention.Seconds()})
	}
	verb := "deleted"
	if *dryRun {
		verb = "would delete (dry run)"
	}
	_, err = fmt.Fprintf(stdout, "%s %d rows of %s sent more than %s ago\n", verb, n, f.table, *retention)
	return err
}

func outboxMigrate(ctx context.Context, args []string, stdout io.Writer) error {
	f := newOutboxFlags("migrate", "[flags]", "Creates the outbox table and its siblings (<table>_leases, _relays, _meta), or brings\nthem to the newest schema. Running it again changes nothing. --shards is stored with a\nnew table; an existing one keeps its count.", stdout)
	shards := f.fs.Int("shards", 0, "shards of a new table: at most this many relays work at once (0: 16)")
	if err := f.parse(args); err != nil {
		return err
	}
	if *shards < 0 {
		return f.fs.usagef("--shards must not be negative (0: the default, 16)")
	}
	o, closeDB, err := f.open(ctx, true, *shards)
	if err != nil {
		return err
	}
	defer closeDB()
	r, err := o.Migrate(ctx)
	if err != nil {
		return err
	}
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"table": f.table, "created": r.Created, "from": r.From, "to": r.To, "shards": r.Shards})
	}
	switch {
	case r.Created:
		_, err = fmt.Fprintf(stdout, "created outbox table %s (schema version %d, %d shards)\n", f.table, r.To, r.Shards)
	case r.From < r.To:
		_, err = fmt.Fprintf(stdout, "migrated outbox table %s from schema version %d to %d (%d shards)\n", f.table, r.From, r.To, r.Shards)
	default:
		_, err = fmt.Fprintf(stdout, "outbox table %s is up to date (schema version %d, %d shards)\n", f.table, r.To, r.Shards)
	}
	return err
}
