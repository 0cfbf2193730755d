package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/idemkit/idem/examples/billing/incident"
)

func init() {
	register(command{
		name:    "demo",
		summary: "replay the billing incident: naive vs idem consumers under redelivery",
		run:     runDemo,
	})
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("idem demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		opts    incident.Options
		kafka   string
		asJSON  bool
		quiet   bool
		renewal int
	)
	fs.StringVar(&opts.Postgres, "postgres", "", "PostgreSQL URL; the demo recreates the schemas idem_demo_naive and idem_demo_idem there (default: SQLite in a temporary directory)")
	fs.StringVar(&opts.RabbitMQ, "rabbitmq", "", "RabbitMQ URL, e.g. amqp://guest:guest@127.0.0.1:5672/ (default: Kafka in process)")
	fs.StringVar(&kafka, "kafka", "", "comma-separated Kafka brokers of a real cluster (default: Kafka in process)")
	fs.IntVar(&renewal, "events", 3100, "SubscriptionRenewed events, one customer each; half as many orders come with them")
	fs.Int64Var(&opts.Seed, "seed", 1, "seed of the generated events and republished copies")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fs.BoolVar(&quiet, "quiet", false, "no progress bar")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: idem demo [flags]\n\nReplays the seeds' incident: a broker restart redelivers deliveries that were processed\nbut not acknowledged, and the producer republishes 5% of events. A naive consumer and an\nidem consumer get the same deliveries; the report compares what they did.\nExit status 0 only when the idem side has no duplicate effect and applied every event.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &exitError{code: 2, msg: "unexpected arguments: " + strings.Join(fs.Args(), " ")}
	}
	opts.Renewals = renewal
	if kafka != "" {
		opts.Kafka = strings.Split(kafka, ",")
	}
	var bar *progressBar
	if !quiet {
		bar = newProgressBar(stderr)
		opts.Progress = bar.update
	}
	rep, err := incident.Run(ctx, opts)
	if bar != nil {
		bar.finish() // clear the bar before the report takes its line
	}
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(struct {
			*incident.Report
			OK bool `json:"ok"`
		}{rep, rep.OK()})
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if !rep.OK() {
		return &exitError{code: 1, msg: "the idem side has duplicate effects or missing events"}
	}
	return nil
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

func (b *progressBar) update(p incident.Progress) {
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
