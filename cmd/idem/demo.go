package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/idemkit/idem/cmd/idem/internal/demo"
)

func init() {
	register(command{
		name:    "demo",
		summary: "replay the billing incident: naive vs idem consumers under redelivery",
		run:     runDemo,
	})
}

// demoDoc is the help of `idem demo`.
const demoDoc = `Replays the billing incident told in docs/design.md: a broker restart redelivers
deliveries that were processed but not acknowledged, and the producer republishes 5%
of events. A naive consumer and an idem consumer get the same deliveries; the report
compares what they did.

What varies between runs: which deliveries the restart catches unacknowledged depends
on timing, so the counts of redeliveries and of the naive side's damage change from
run to run, even with the same --seed (the seed fixes the events published). What
does not: the naive side applies redelivered events again; the idem side applies
each event once.

Exit status: 0 when the idem side has no duplicate effect and applied every event;
1 when it has or did not; 2 for a bad flag; 3 when the demo could not run (a service
unreachable or not answering within --connect-timeout).`

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newCmdFlags("demo", "[flags]", demoDoc, stdout)
	var (
		opts    demo.Options
		kafka   string
		asJSON  bool
		quiet   bool
		renewal int
	)
	f.StringVar(&opts.Postgres, "database", "", "PostgreSQL URL; the demo recreates the schemas idem_demo_naive and idem_demo_idem there and keeps them (default: SQLite)")
	f.StringVar(&opts.MySQL, "mysql", "", "MySQL or MariaDB DSN, the driver's form user:password@tcp(host:3306)/database (as mysqlinbox.Open takes); the demo recreates the databases idem_demo_naive and idem_demo_idem on that server and keeps them (default: SQLite)")
	f.StringVar(&opts.SchemaPrefix, "prefix", "idem_demo", "name prefix of the demo's PostgreSQL schemas or MySQL databases (prefix_naive, prefix_idem)")
	f.StringVar(&opts.SQLiteDir, "sqlite-dir", "", "without --database or --mysql: keep the SQLite files naive.db and idem.db in this directory, replacing them (default: a temporary directory removed at exit)")
	f.StringVar(&opts.RabbitMQ, "amqp", "", "RabbitMQ URL, e.g. amqp://guest:guest@127.0.0.1:5672/ (default: Kafka in process)")
	f.StringVar(&kafka, "brokers", "", "comma-separated Kafka seed brokers of a real cluster (default: Kafka in process)")
	f.DurationVar(&opts.ConnectTimeout, "connect-timeout", defaultConnectTimeout, "give up when PostgreSQL, MySQL or RabbitMQ has not accepted and answered a connection within this time (0: no limit)")
	f.IntVar(&renewal, "events", 3100, "SubscriptionRenewed events, one customer each, from 10 to 1,000,000; half as many orders come with them")
	f.Int64Var(&opts.Seed, "seed", 1, "random seed of the generated events and of which of them are republished, any whole number (0 is a seed like the others); the redelivery counts still vary with timing")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&quiet, "quiet", false, "no progress bar")
	// The spellings of before the commands shared one vocabulary.
	f.alias("postgres", "database")
	f.alias("rabbitmq", "amqp")
	f.alias("kafka", "brokers")
	if err := f.parse(args, false); err != nil {
		return err
	}
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = -1 // the flag's 0 is "no limit"
	} else if opts.ConnectTimeout < 0 {
		return f.usagef("--connect-timeout must not be negative (0: no limit)")
	}
	// Checked here, not by Options.Validate: the library reads 0 renewals
	// as its default, and a 0 typed on the command line must not be.
	if err := demo.CheckRenewals(renewal); err != nil {
		return f.usagef("%s", err)
	}
	opts.Renewals = renewal
	if kafka != "" {
		opts.Kafka = strings.Split(kafka, ",")
	}
	if err := opts.Validate(); err != nil {
		return f.usagef("%s", oneLine(err.Error()))
	}
	var bar *progressBar
	if !quiet {
		bar = newProgressBar(stderr)
		opts.Progress = bar.update
	}
	rep, err := demo.Run(ctx, opts)
	if bar != nil {
		bar.finish() // clear the bar before the report takes its line
	}
	if err != nil {
		return errors.New(oneLine(err.Error()))
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(struct {
			*demo.Report
			OK bool `json:"ok"`
		}{rep, rep.OK()})
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if !rep.OK() {
		return &exitError{code: exitFindings, msg: "the idem side has duplicate effects or missing events"}
	}
	return nil
}

// oneLine joins the lines of an error (errors.Join puts one per line) so
// that the command fails with one line: "; " between lines, a space after
// a line that ends in a colon (its cause follows on the next).
func oneLine(s string) string {
	var parts []string
	for line := range strings.Lines(s) {
		line = strings.Join(strings.Fields(line), " ")
		if line == "" {
			continue
		}
		if n := len(parts); n > 0 && strings.HasSuffix(parts[n-1], ":") {
			parts[n-1] += " " + line
			continue
		}
		parts = append(parts, line)
	}
	return strings.Join(parts, "; ")
}

// progressBar draws the demo's progress on a terminal, redrawing one line;
// on anything else it writes a line per phase, so logs stay readable.
type progressBar struct {
	w     io.Writer
	tty   bool
	phase string
	drawn bool
}

func newProgressBar(w io.Writer) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progressBar{w: w, tty: tty}
}

func (b *progressBar) update(p demo.Progress) {
	if !b.tty {
		if p.Phase != b.phase {
			fmt.Fprintf(b.w, "demo: %s (%d/%d deliveries acknowledged)\n", p.Phase, p.Done, p.Total)
			b.phase = p.Phase
		}
		return
	}
	const width = 30
	filled := 0
	if p.Total > 0 {
		filled = min(width, p.Done*width/p.Total)
	}
	restarts := ""
	if p.Consumers > 0 {
		restarts = fmt.Sprintf("  broker restarts %d/%d", p.Restarts, p.Consumers)
	}
	fmt.Fprintf(b.w, "\r[%s%s] %6d/%-6d %-11s%s ", strings.Repeat("█", filled), strings.Repeat("░", width-filled), p.Done, p.Total, p.Phase, restarts)
	b.drawn = true
}

func (b *progressBar) finish() {
	if b.tty && b.drawn {
		fmt.Fprint(b.w, "\r\033[K")
	}
}
