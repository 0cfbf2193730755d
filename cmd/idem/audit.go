package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkit/idem/audit"
)

func init() {
	register(command{name: "audit", summary: "find, void and fence duplicate business rows", run: runAudit})
}

const auditUsage = `usage: idem audit <duplicates|void|guard|check> --table T --key c1,c2 [flags]

The repair of a table that already has duplicate rows, in this order:
  duplicates  report duplicate groups, exact totals, and whether they are still being created
  void        mark every duplicate but the earliest as voided (dry run; --apply writes)
  guard       build the unique index that fences the table (--print shows it)
  check       count duplicate groups among live rows; exit 1 when any (--every to watch)

Live rows are those whose --status-column is not --void-value. A table with no
status column: --status-column - (or ''), and every row is live. A table with
no id column: --id - (or ''); rows are then told apart by their physical
address, so duplicates, check and guard work, and void refuses.

The database is PostgreSQL (--database URL) or MySQL/MariaDB (--mysql DSN, the
driver's form user:password@tcp(host:3306)/database; the table needs an id column
there, and the guard is a virtual idem_live column with a unique index on the key
and it, built with ALGORITHM=INPLACE, LOCK=NONE).

Run 'idem audit <subcommand> -h' for its flags.
`

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, auditUsage)
		return &usageError{cmd: "audit", msg: "missing subcommand"}
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "duplicates":
		return auditDuplicates(ctx, rest, stdout, stderr)
	case "void":
		return auditVoid(ctx, rest, stdout, stderr)
	case "guard":
		return auditGuard(ctx, rest, stdout, stderr)
	case "check":
		return auditCheck(ctx, rest, stdout, stderr)
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, auditUsage)
		return nil
	default:
		return &usageError{cmd: "audit", msg: fmt.Sprintf("unknown subcommand %q (want duplicates, void, guard or check)", sub)}
	}
}

// auditFlags are the flags every audit subcommand shares.
type auditFlags struct {
	fs          *cmdFlags
	db          dbFlags
	mysql       string
	jsonOut     bool
	table       string
	key         string
	id          string
	time        string
	amount      string
	status      string
	voidValue   string
	paidValue   string
	quietPeriod time.Duration
	// void's audit columns; set on every subcommand so the spec is the same.
	reasonColumn, byColumn, atColumn, prevColumn string
}

func newAuditFlags(sub, summary string, stdout io.Writer) *auditFlags {
	f := &auditFlags{fs: newCmdFlags("audit "+sub, "--table T --key c1,c2 [flags]", summary, stdout)}
	fs := f.fs
	f.db.add(fs.FlagSet)
	fs.StringVar(&f.mysql, "mysql", "", mysqlFlagHelp)
	fs.BoolVar(&f.jsonOut, "json", false, "print the result as JSON")
	fs.StringVar(&f.table, "table", "", "business table, optionally schema.table (required)")
	fs.StringVar(&f.key, "key", "", "comma-separated business key columns that must be unique among live rows (required)")
	fs.StringVar(&f.id, "id", "id", "row identity column (ties on time are broken by it); - or '' for a table without one")
	fs.StringVar(&f.time, "time", "created_at", "creation time column: the earliest row of a group is kept")
	fs.StringVar(&f.amount, "amount", "", "money column to total (optional)")
	fs.StringVar(&f.status, "status-column", "status", "status column; - or '' for a table without one (every row is live)")
	fs.StringVar(&f.voidValue, "void-value", "VoidedDuplicate", "status of a voided duplicate; rows with it are not live")
	fs.StringVar(&f.paidValue, "paid-value", "Paid", "comma-separated statuses of paid rows (never voided without --include-paid)")
	fs.DurationVar(&f.quietPeriod, "quiet-period", time.Hour, "duplicates are still being created when the newest duplicate row is younger than this (database clock)")
	if sub == "void" {
		fs.StringVar(&f.reasonColumn, "reason-column", "voided_reason", "column that receives --reason")
		fs.StringVar(&f.byColumn, "by-column", "voided_by", "column that receives --by")
		fs.StringVar(&f.atColumn, "at-column", "voided_at", "column that receives the time of the void")
		fs.StringVar(&f.prevColumn, "previous-column", "voided_from_status", "column that receives the status before the void (a voided Paid row still says Paid); - for none")
	}
	return f
}

// parse parses args (flags only) and checks the required ones.
func (f *auditFlags) parse(args []string) error {
	if err := f.fs.parse(args, false); err != nil {
		return err
	}
	switch {
	case f.table == "" && f.key == "":
		return f.fs.usagef("--table and --key are required")
	case f.table == "":
		return f.fs.usagef("--table is required")
	case f.key == "":
		return f.fs.usagef("--key is required")
	case f.quietPeriod <= 0:
		return f.fs.usagef("--quiet-period must be positive (to void while duplicates are still being created, pass --force)")
	case f.time == "":
		return f.fs.usagef("--time must name the creation time column: the earliest row of a group is the one kept")
	case f.voidValue == "":
		return f.fs.usagef("--void-value must not be empty")
	case len(auditSplit(f.paidValue)) == 0:
		return f.fs.usagef("--paid-value must name at least one status (when no row is ever paid, a status no row has will do)")
	}
	// void's own columns: an empty name would silently mean the default.
	for _, c := range []struct{ flag, v string }{{"reason-column", f.reasonColumn}, {"by-column", f.byColumn}, {"at-column", f.atColumn}} {
		if f.fs.Lookup(c.flag) != nil && c.v == "" {
			return f.fs.usagef("--%s must name a column", c.flag)
		}
	}
	switch {
	case f.mysql != "" && f.db.database != "":
		return f.fs.usagef("--mysql and --database name two databases: give one")
	case looksLikeMySQL(f.db.database):
		return f.fs.usagef("--database takes a PostgreSQL URL; for MySQL or MariaDB give the DSN with --mysql (%s)", mysqlForm)
	case f.mysql != "":
		if _, err := checkMySQL(f.mysql); err != nil {
			return f.fs.usagef("%s", err)
		}
	}
	return f.db.validate()
}

// noColumn maps the command line's two spellings of "no such column",
// "-" and the empty string,
// to the spec's.
func noColumn(v string) string {
	if v == "" || v == "-" {
		return audit.NoColumn
	}
	return v
}

func (f *auditFlags) spec() audit.Spec {
	return audit.Spec{
		Table: f.table, Key: auditSplit(f.key), ID: noColumn(f.id), Time: f.time, Amount: f.amount,
		Status: noColumn(f.status), VoidValue: f.voidValue, PaidValues: auditSplit(f.paidValue),
		ReasonColumn: f.reasonColumn, ActorColumn: f.byColumn, VoidedAtColumn: f.atColumn,
		PreviousStatusColumn: noPrevious(f.prevColumn, f.fs.Lookup("previous-column") != nil),
		QuietPeriod:          f.quietPeriod,
	}
}

// noPrevious maps an empty --previous-column to "-", none, as for the status and
// id columns; on the subcommands without the flag it is left to the default.
func noPrevious(v string, defined bool) string {
	if defined && v == "" {
		return audit.NoColumn
	}
	return v
}

func auditSplit(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// auditor validates the spec (a refused name is a usage error, exit 2)
// and, unless offline, opens the database.
func (f *auditFlags) auditor(ctx context.Context, offline bool) (*audit.Auditor, func(), error) {
	if f.mysql != "" {
		return f.mysqlAuditor(ctx, offline)
	}
	if _, err := audit.New(nil, f.spec()); err != nil {
		return nil, nil, f.fs.usagef("%s", auditFlagTerms(err.Error()))
	}
	if offline {
		a, _ := audit.New(nil, f.spec())
		return a, func() {}, nil
	}
	pool, err := f.db.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	a, err := audit.New(pool, f.spec())
	if err != nil {
		pool.Close()
		return nil, nil, f.fs.usagef("%s", auditFlagTerms(err.Error()))
	}
	return a, pool.Close, nil
}

// mysqlAuditor is auditor on the --mysql database.
func (f *auditFlags) mysqlAuditor(ctx context.Context, offline bool) (*audit.Auditor, func(), error) {
	a, err := audit.NewMySQL(nil, f.spec())
	if err != nil {
		return nil, nil, f.fs.usagef("%s", auditFlagTerms(err.Error()))
	}
	if offline {
		return a, func() {}, nil
	}
	db, err := openMySQL(ctx, f.mysql, &f.db)
	if err != nil {
		return nil, nil, err
	}
	a, err = audit.NewMySQL(db, f.spec())
	if err != nil {
		_ = db.Close()
		return nil, nil, f.fs.usagef("%s", auditFlagTerms(err.Error()))
	}
	return a, func() { _ = db.Close() }, nil
}

// auditFlagTerms names the flags in a spec error, whose terms are the
// library's ("status column", "void value").
func auditFlagTerms(msg string) string {
	r := strings.NewReplacer(
		"invalid audit spec: ", "",
		"table: ", "--table: ",
		"key: ", "--key: ",
		"id column: ", "--id: ",
		"time column: ", "--time: ",
		"amount column: ", "--amount: ",
		"status column: ", "--status-column: ",
		"reason column: ", "--reason-column: ",
		"actor column: ", "--by-column: ",
		"voided-at column: ", "--at-column: ",
		"previous-status column: ", "--previous-column: ",
		"void value ", "--void-value ",
		"paid value", "--paid-value",
		"quiet period", "--quiet-period",
	)
	return strings.ReplaceAll(r.Replace(msg), "\n", "; ")
}

func auditJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func auditDuplicates(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newAuditFlags("duplicates", "Reports every key held by more than one live row: count, earliest, latest, amount, paid rows;\nexact totals over all groups; and whether duplicates are still being created.", stdout)
	limit := f.fs.Int("limit", 50, "list at most this many groups, newest first (0: all); totals always cover all")
	if err := f.parse(args); err != nil {
		return err
	}
	if *limit < 0 {
		return f.fs.usagef("--limit must not be negative (0 lists all)")
	}
	a, closeDB, err := f.auditor(ctx, false)
	if err != nil {
		return err
	}
	defer closeDB()
	rep, err := a.Duplicates(ctx, *limit)
	if err != nil {
		return err
	}
	if f.jsonOut {
		return auditJSON(stdout, rep)
	}
	spec := a.Spec()
	live := fmt.Sprintf("%s is not '%s'", spec.Status, spec.VoidValue)
	if spec.Status == audit.NoColumn {
		live = "every row (no status column)"
	}
	fmt.Fprintf(stdout, "table %s, key (%s); live rows: %s\n\n", rep.Table, strings.Join(rep.KeyColumns, ", "), live)
	if len(rep.Groups) > 0 {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		head := append(append([]string(nil), rep.KeyColumns...), "rows", "earliest", "latest")
		if spec.Amount != "" {
			head = append(head, "amount", "extra")
		}
		head = append(head, "paid", "keep id")
		fmt.Fprintln(tw, strings.ToUpper(strings.Join(head, "\t")))
		for _, g := range rep.Groups {
			cells := append(append([]string(nil), g.Key...), fmt.Sprint(g.Rows), auditTime(g.Earliest), auditTime(g.Latest))
			if spec.Amount != "" {
				cells = append(cells, auditStr(g.Amount), auditStr(g.ExtraAmount))
			}
			paid := "no"
			if g.PaidRows > 0 {
				paid = fmt.Sprintf("%d", g.PaidRows)
				if g.PaidExtras > 0 {
					paid += fmt.Sprintf(" (%d extra)", g.PaidExtras)
				}
			}
			cells = append(cells, paid, g.KeepID)
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
		_ = tw.Flush()
		if rep.Truncated {
			fmt.Fprintf(stdout, "(%d of %d groups, newest first; --limit 0 lists all)\n", len(rep.Groups), rep.Summary.Groups)
		}
		fmt.Fprintln(stdout)
	}
	s := rep.Summary
	amt := func(p *string) string {
		if spec.Amount == "" || p == nil {
			return ""
		}
		return "amount " + *p
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "duplicate groups:\t%d\t\t\n", s.Groups)
	fmt.Fprintf(tw, "rows in them:\t%d\t%s\t\n", s.Rows, amt(s.Amount))
	fmt.Fprintf(tw, "extra rows:\t%d\t%s\tall but the earliest of each group\n", s.ExtraRows, amt(s.ExtraAmount))
	if spec.Status != audit.NoColumn {
		fmt.Fprintf(tw, "  unpaid:\t%d\t%s\t-> idem audit void\n", s.UnpaidExtraRows, amt(s.UnpaidExtraAmount))
		fmt.Fprintf(tw, "  paid:\t%d\t%s\t-> refund first; void skips them\n", s.PaidExtraRows, amt(s.PaidExtraAmount))
	}
	_ = tw.Flush()
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		fmt.Fprint(stdout, strings.TrimRight(line, " \n")+strings.Repeat("\n", strings.Count(line, "\n")))
	}
	fmt.Fprintf(stdout, "verdict: %s\n", s.Activity.Verdict())
	if spec.Status == audit.NoColumn && s.ExtraRows > 0 {
		fmt.Fprintln(stdout, "no status column: void cannot mark the extra rows; remove or merge them, then fence the table with idem audit guard")
	}
	return nil
}

func auditVoid(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newAuditFlags("void", "Marks every live row but the earliest of each key as voided (status, reason, actor, time),\nin one transaction. Dry run unless --apply. Skips paid rows and lists them for refund.\nRefuses while duplicates are still being created, unless --force. Never deletes.", stdout)
	var opt audit.VoidOptions
	f.fs.BoolVar(&opt.Apply, "apply", false, "write (default: dry run, nothing written)")
	f.fs.StringVar(&opt.Reason, "reason", "", "why the rows are voided, written to --reason-column (required with --apply)")
	f.fs.StringVar(&opt.Actor, "by", "", "who voids them, written to --by-column (required with --apply)")
	f.fs.BoolVar(&opt.Force, "force", false, "void even though duplicates are still being created")
	f.fs.BoolVar(&opt.IncludePaid, "include-paid", false, "void paid duplicates too: only after their refunds are done")
	f.fs.BoolVar(&opt.AddColumns, "add-columns", false, "add the missing reason/by/at/previous-status columns (text, text, timestamptz, text) in the same transaction")
	limit := f.fs.Int("limit", 50, "list at most this many rows of each kind in the text output (0: all); --json lists all")
	f.fs.DurationVar(&opt.LockTimeout, "lock-timeout", 10*time.Second, "give up when a lock is not granted within this time (0: the server's setting)")
	// --why, as idem dlq replay says it.
	f.fs.alias("why", "reason")
	if err := f.parse(args); err != nil {
		return err
	}
	if *limit < 0 {
		return f.fs.usagef("--limit must not be negative (0 lists all)")
	}
	if opt.LockTimeout < 0 {
		return f.fs.usagef("--lock-timeout must not be negative (0: the server's setting)")
	}
	if opt.LockTimeout == 0 {
		opt.LockTimeout = -1
	}
	if opt.Apply && (strings.TrimSpace(opt.Reason) == "" || strings.TrimSpace(opt.Actor) == "") {
		return f.fs.usagef("--apply needs --reason and --by: every voided row records why and by whom")
	}
	if noColumn(f.status) == audit.NoColumn {
		return f.fs.usagef("void marks rows by their --status-column: a table without one has nothing to void with")
	}
	if noColumn(f.id) == audit.NoColumn {
		return f.fs.usagef("void names every row it voids by its --id column: a table without one cannot be voided (duplicates, check and guard work without it)")
	}
	a, closeDB, err := f.auditor(ctx, false)
	if err != nil {
		return err
	}
	defer closeDB()
	res, err := a.Void(ctx, opt)
	if errors.Is(err, audit.ErrMissingColumns) {
		return fmt.Errorf("%w; add them with --add-columns, or name existing columns with --reason-column, --by-column, --at-column, --previous-column", err)
	}
	if res == nil {
		return err
	}
	if f.jsonOut {
		if jerr := auditJSON(stdout, res); jerr != nil {
			return jerr
		}
	} else {
		auditPrintVoid(stdout, a.Spec(), opt, res, *limit, errors.Is(err, audit.ErrStillBeingCreated))
	}
	if errors.Is(err, audit.ErrStillBeingCreated) {
		return &exitError{code: exitFindings, msg: "refused: " + err.Error() + ", or pass --force"}
	}
	return err
}

// auditPrintVoid prints a void's report. Its first line says what was
// written, and, when nothing was, why: a dry run, or a refusal (refused:
// duplicates still being created, inside the quiet period).
func auditPrintVoid(w io.Writer, spec audit.Spec, opt audit.VoidOptions, res *audit.VoidResult, limit int, refused bool) {
	stillCreated := func() string {
		return fmt.Sprintf("duplicates are still being created (the newest duplicate row is %s old, inside the --quiet-period of %s)",
			res.Activity.Age().Round(time.Second), res.Activity.QuietPeriod)
	}
	switch {
	case res.Applied:
		fmt.Fprintln(w, "APPLIED: committed in one transaction.")
	case refused && opt.Apply:
		fmt.Fprintf(w, "REFUSED: nothing written: %s; stop the producer and wait out the quiet period, or add --force to void anyway.\n", stillCreated())
	case refused:
		fmt.Fprintf(w, "DRY RUN: nothing written; %s: --apply would be refused until the quiet period is over, unless --force.\n", stillCreated())
	default:
		fmt.Fprintln(w, "DRY RUN: nothing written; add --apply --reason TEXT --by WHO to void.")
	}
	fmt.Fprintf(w, "table %s, key (%s)\n", res.Table, strings.Join(res.KeyColumns, ", "))
	amt := func(p *string) string {
		if spec.Amount == "" || p == nil || *p == "0" {
			return ""
		}
		return ", amount " + *p
	}
	verb := "to void"
	if res.Applied {
		verb = "voided"
	}
	fmt.Fprintf(w, "duplicate groups: %d (the earliest live row of each is kept)\n", res.Groups)
	fmt.Fprintf(w, "rows %s: %d%s\n", verb, len(res.Voided), amt(res.VoidedAmount))
	if opt.IncludePaid {
		fmt.Fprintf(w, "paid rows among them: %d%s (--include-paid: each must have been refunded)\n", len(res.Refund), amt(res.RefundAmount))
	} else {
		fmt.Fprintf(w, "paid rows skipped: %d%s\n", len(res.Refund), amt(res.RefundAmount))
	}
	if len(res.AddedColumns) > 0 {
		added := "columns to add"
		if res.Applied {
			added = "columns added"
		}
		fmt.Fprintf(w, "%s: %s\n", added, strings.Join(res.AddedColumns, ", "))
	}
	fmt.Fprintf(w, "verdict: %s\n", res.Activity.Verdict())
	if res.Forced && res.Activity.StillBeingCreated && len(res.Voided) > 0 {
		fmt.Fprintln(w, "forced: voiding although duplicates are still being created")
	}
	table := func(title string, rows []audit.Row) {
		if len(rows) == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := append([]string{"id", "keeps"}, res.KeyColumns...)
		head = append(head, "created")
		if spec.Amount != "" {
			head = append(head, "amount")
		}
		head = append(head, "status")
		fmt.Fprintln(tw, strings.ToUpper(strings.Join(head, "\t")))
		shown := rows
		if limit > 0 && len(rows) > limit {
			shown = rows[:limit]
		}
		for _, r := range shown {
			cells := append([]string{r.ID, r.KeepID}, r.Key...)
			cells = append(cells, auditTime(r.Created))
			if spec.Amount != "" {
				cells = append(cells, auditStr(r.Amount))
			}
			cells = append(cells, auditStr(r.Status))
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
		_ = tw.Flush()
		if len(shown) < len(rows) {
			fmt.Fprintf(w, "... and %d more (--limit 0 or --json lists all)\n", len(rows)-len(shown))
		}
	}
	title := "rows to void"
	if res.Applied {
		title = "rows voided"
	}
	table(title, res.Voided)
	if !opt.IncludePaid {
		table("paid duplicates NOT voided: refund these, then run void --include-paid", res.Refund)
	}
}

func auditGuard(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newAuditFlags("guard", "Builds the partial unique index on the key over rows that are not voided, with\nCREATE UNIQUE INDEX CONCURRENTLY, after checking that no live duplicates remain.\nWriters are not blocked; the build waits for every older transaction in the database.\nOn MySQL/MariaDB (--mysql): a virtual idem_live column and a unique index on the key\nand it, each built INPLACE without blocking writes.", stdout)
	index := f.fs.String("index", "", "index name (default ux_<table>_<key columns>)")
	printOnly := f.fs.Bool("print", false, "print the DDL and exit, without connecting")
	if err := f.parse(args); err != nil {
		return err
	}
	a, closeDB, err := f.auditor(ctx, *printOnly)
	if err != nil {
		return err
	}
	defer closeDB()
	if *printOnly {
		ddl, err := a.GuardDDL(*index)
		if err != nil {
			return f.fs.usagef("--index: %v", err)
		}
		if f.jsonOut {
			return auditJSON(stdout, map[string]string{"ddl": ddl})
		}
		fmt.Fprintln(stdout, ddl)
		return nil
	}
	res, err := a.Guard(ctx, *index)
	switch {
	case errors.Is(err, audit.ErrInvalidName):
		return f.fs.usagef("--index: %v", err)
	case errors.Is(err, audit.ErrIndexNameTaken):
		return fmt.Errorf("%w; choose another with --index", err)
	case errors.Is(err, audit.ErrViolations) && res != nil:
		// A finding, like check's: the result says how many.
		if f.jsonOut {
			if jerr := auditJSON(stdout, res); jerr != nil {
				return jerr
			}
		}
		return &exitError{code: exitFindings, msg: "refused: " + err.Error()}
	case err != nil:
		return err
	}
	if f.jsonOut {
		return auditJSON(stdout, res)
	}
	for _, warn := range res.Warnings {
		fmt.Fprintln(stderr, "warning: "+warn)
	}
	switch {
	case res.Existing != "":
		fmt.Fprintf(stdout, "index %s already exists and is valid; nothing to do:\n%s\n", res.Index, res.Existing)
	default:
		if res.DroppedInvalid {
			fmt.Fprintf(stdout, "dropped the invalid index %s left by an earlier failed build\n", res.Index)
		}
		fmt.Fprintf(stdout, "no duplicate groups among live rows of %s\ncreated index %s in %s:\n%s\n", res.Table, res.Index, res.Elapsed, res.DDL)
	}
	return nil
}

func auditCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newAuditFlags("check", "Counts duplicate groups among live rows. Exit status 0 when none, 1 when any, 3 when the\ncheck could not run. With --every it keeps running and exports the count as a Prometheus\ngauge on --listen: once the guard index exists the count must stay 0; anything else means\nthe index was dropped or a write path bypassed it.", stdout)
	every := f.fs.Duration("every", 0, "check again at this interval and serve /metrics (for example 6h); 0: check once")
	listen := f.fs.String("listen", ":9465", "address for /metrics with --every")
	if err := f.parse(args); err != nil {
		return err
	}
	if *every < 0 {
		return f.fs.usagef("--every must be positive (0: check once)")
	}
	a, closeDB, err := f.auditor(ctx, false)
	if err != nil {
		return err
	}
	defer closeDB()
	if *every == 0 {
		res, err := a.Check(ctx)
		if err != nil {
			return err
		}
		if err := auditPrintCheck(stdout, f.jsonOut, res); err != nil {
			return err
		}
		if res.Groups > 0 {
			return &exitError{code: exitFindings}
		}
		return nil
	}
	return auditWatch(ctx, a, f, *every, *listen, stdout, stderr)
}

func auditPrintCheck(w io.Writer, jsonOut bool, res *audit.CheckResult) error {
	if jsonOut {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	guard := "no unique index on the key: run idem audit guard"
	if res.GuardIndex != "" {
		guard = "guarded by " + res.GuardIndex
	}
	state := "OK"
	if res.Groups > 0 {
		state = "DUPLICATES"
		if res.GuardIndex != "" {
			guard += ", which was bypassed"
		}
	}
	_, err := fmt.Fprintf(w, "%s %s %s (%s): %d duplicate groups, %d extra rows among live rows; %s\n",
		res.CheckedAt.Format(time.RFC3339), state, res.Table, strings.Join(res.KeyColumns, ", "), res.Groups, res.ExtraRows, guard)
	return err
}

// auditWatch runs the check every interval and serves its result as gauges.
// It returns nil when ctx ends (SIGINT, SIGTERM).
func auditWatch(ctx context.Context, a *audit.Auditor, f *auditFlags, every time.Duration, listen string, stdout, stderr io.Writer) error {
	labels := prometheus.Labels{"table": f.table, "key": strings.Join(auditSplit(f.key), ",")}
	names := []string{"table", "key"}
	groups := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_audit_duplicate_groups",
		Help: "Keys held by more than one live row at the last check; must be 0 once the guard index exists."}, names)
	extra := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_audit_duplicate_extra_rows",
		Help: "Live rows beyond the first of each duplicated key at the last check."}, names)
	guarded := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_audit_guard_index_present",
		Help: "1 when a valid unique index on exactly the key exists, else 0."}, names)
	last := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_audit_last_check_success_timestamp_seconds",
		Help: "Unix time of the last check that ran."}, names)
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_audit_check_errors_total",
		Help: "Checks that could not run."}, names)
	reg := prometheus.NewRegistry()
	reg.MustRegister(groups, extra, guarded, last, failures)
	failures.With(labels).Add(0)

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listening on %s for /metrics: %w", listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintf(stderr, "idem audit check: every %s, metrics on http://%s/metrics\n", every, ln.Addr())

	watchErr := make(chan error, 1)
	go func() {
		watchErr <- a.Watch(ctx, every, func(res *audit.CheckResult, err error) {
			if err != nil {
				failures.With(labels).Inc()
				fmt.Fprintf(stderr, "%s check failed: %v\n", time.Now().UTC().Format(time.RFC3339), err)
				return
			}
			groups.With(labels).Set(float64(res.Groups))
			extra.With(labels).Set(float64(res.ExtraRows))
			present := 0.0
			if res.GuardIndex != "" {
				present = 1
			}
			guarded.With(labels).Set(present)
			last.With(labels).Set(float64(res.CheckedAt.UnixNano()) / 1e9)
			_ = auditPrintCheck(stdout, f.jsonOut, res)
		})
	}()
	select {
	case err := <-watchErr:
		return err
	case err := <-served:
		return fmt.Errorf("serving /metrics: %w", err)
	}
}

func auditTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func auditStr(p *string) string {
	if p == nil {
		return "-"
	}
	return *p
}
