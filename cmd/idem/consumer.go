package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
)

func init() {
	register(command{name: "consumer", summary: "pause, resume or show the pause of a consumer, in every process at once", run: runConsumer})
}

// consumerDocs are the subcommands of `idem consumer`.
var consumerDocs = map[string]string{
	"pause": "Pauses a consumer everywhere: every instance of it, in every process, reads the pause\n" +
		"within seconds, claims nothing more and holds its messages unacknowledged, without\n" +
		"spending their attempts or dead-lettering any, until it is resumed. Who paused it,\n" +
		"when and why are kept beside the inbox table and in its audit table\n" +
		"(idem_consumer_pause_log), and shown in the consumers' health and metrics.",
	"resume": "Resumes a paused consumer: its instances read the resume within seconds and apply\n" +
		"the messages they held, each once. Kept in the audit table.",
	"status": "Prints the paused consumers of the inbox table, with who paused each, when and why\n" +
		"(--consumer: that consumer only). A consumer not listed is running.",
}

// consumerSummaries are the subcommands' lines in `idem consumer -h`.
var consumerSummaries = map[string]string{
	"pause":  "hold a consumer's messages in every process within seconds (--consumer, --why, --by)",
	"resume": "apply them again, each once",
	"status": "the paused consumers, with who paused each, when and why",
}

func consumerUsage(w io.Writer) {
	fmt.Fprint(w, "usage: idem consumer <pause|resume|status> [flags]\n\nsubcommands:\n")
	for _, n := range []string{"pause", "resume", "status"} {
		fmt.Fprintf(w, "  %-7s %s\n", n, consumerSummaries[n])
	}
	fmt.Fprint(w, "\nThe database: --database URL (PostgreSQL), --sqlite FILE, or --mysql DSN.\nRun 'idem consumer <subcommand> -h' for flags.\n")
}

func runConsumer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		consumerUsage(stderr)
		return &usageError{cmd: "consumer", msg: "missing subcommand"}
	}
	if isHelp(args[0]) {
		consumerUsage(stdout)
		return nil
	}
	if _, ok := consumerDocs[args[0]]; !ok {
		return &usageError{cmd: "consumer", msg: fmt.Sprintf("unknown subcommand %q (want pause, resume or status)", args[0])}
	}
	return consumerCommand(ctx, args[0], args[1:], stdout, stderr)
}

// pauseStore is what the consumer commands need of either store.
type pauseStore interface {
	Pause(ctx context.Context, consumer, by, why string) (idemstore.Pause, bool, error)
	Resume(ctx context.Context, consumer, by, why string) (idemstore.Pause, error)
	Paused(ctx context.Context, consumer string) (idemstore.Pause, error)
	Pauses(ctx context.Context) ([]inboxdb.ConsumerPause, error)
}

func consumerCommand(ctx context.Context, op string, args []string, stdout, stderr io.Writer) error {
	synopsis := "--consumer NAME --why WHY [--by WHO] [flags]"
	switch op {
	case "resume":
		synopsis = "--consumer NAME [--why WHY] [--by WHO] [flags]"
	case "status":
		synopsis = "[--consumer NAME] [flags]"
	}
	f := &inboxFlags{fs: newCmdFlags("consumer "+op, synopsis, consumerDocs[op], stdout), logger: slog.New(slog.NewTextHandler(stderr, nil))}
	f.db.add(f.fs.FlagSet)
	f.fs.StringVar(&f.sqlite, "sqlite", "", "SQLite database file, instead of --database")
	f.fs.StringVar(&f.mysql, "mysql", "", mysqlFlagHelp)
	f.fs.StringVar(&f.table, "table", "idem_inbox", "the consumer's inbox table, optionally schema-qualified")
	f.fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	consumer := f.fs.String("consumer", "", "the consumer's name (Config.Consumer)")
	var by, why string
	if op != "status" {
		f.fs.StringVar(&by, "by", "", "who acts, kept with the pause and in the audit table (default: the user running idem)")
		whyDoc := "why (an incident, a ticket), kept with the pause and in the audit table; required"
		if op == "resume" {
			whyDoc = "why, kept in the audit table (default \"resumed\")"
		}
		f.fs.StringVar(&why, "why", "", whyDoc)
	}
	if err := f.parse(args); err != nil {
		return err
	}
	if rest := f.fs.Args(); len(rest) > 0 {
		return f.fs.usagef("unexpected arguments: %s", strings.Join(rest, " "))
	}
	if op != "status" || flagGiven(f.fs, "consumer") {
		if strings.TrimSpace(*consumer) == "" {
			return f.fs.usagef("--consumer is required: the name the consumer's processor is configured with")
		}
	}
	if op != "status" {
		if op == "resume" && strings.TrimSpace(why) == "" {
			why = "resumed"
		}
		if strings.TrimSpace(why) == "" {
			return f.fs.usagef("--why is required: it is kept with the pause, shown in the consumers' health, and in the audit table")
		}
		if by == "" {
			by = currentUser()
		}
		if strings.TrimSpace(by) == "" {
			return f.fs.usagef("--by is required (no user name found)")
		}
	}
	var store pauseStore
	var closeDB func()
	var err error
	if f.sqlite != "" || f.mysql != "" {
		store, closeDB, err = f.sqlStore(ctx)
	} else {
		store, closeDB, err = f.pgStore(ctx)
	}
	if err != nil {
		return err
	}
	defer closeDB()
	switch op {
	case "pause":
		p, already, err := store.Pause(ctx, *consumer, by, why)
		if err != nil {
			return err
		}
		if f.jsonOut {
			return printJSON(stdout, pauseJSON(*consumer, p, map[string]any{"already": already}))
		}
		verb := "paused"
		if already {
			verb = "was already paused"
		}
		_, err = fmt.Fprintf(stdout, "consumer %s %s %s\nevery instance holds its messages within %s, unacknowledged and without spending attempts, until: idem consumer resume --consumer %s\n",
			*consumer, verb, pauseLine(p), idem.PauseTTL, *consumer)
		return err
	case "resume":
		p, err := store.Resume(ctx, *consumer, by, why)
		if errors.Is(err, inboxdb.ErrNotPaused) {
			return fmt.Errorf("consumer %s of %s is not paused", *consumer, f.table)
		}
		if err != nil {
			return err
		}
		if f.jsonOut {
			return printJSON(stdout, pauseJSON(*consumer, p, map[string]any{"resumed_by": by, "resumed_why": why}))
		}
		_, err = fmt.Fprintf(stdout, "consumer %s resumed by %s (paused %s, for %s)\nevery instance applies the messages it held within %s\n",
			*consumer, by, pauseLine(p), time.Since(p.Since).Round(time.Second), idem.PauseTTL+idem.PauseHoldDelay)
		return err
	}
	if flagGiven(f.fs, "consumer") {
		p, err := store.Paused(ctx, *consumer)
		if err != nil {
			return err
		}
		if f.jsonOut {
			return printJSON(stdout, pauseJSON(*consumer, p, nil))
		}
		if !p.Paused {
			_, err = fmt.Fprintf(stdout, "consumer %s is not paused\n", *consumer)
			return err
		}
		_, err = fmt.Fprintf(stdout, "consumer %s is paused %s\n", *consumer, pauseLine(p))
		return err
	}
	ps, err := store.Pauses(ctx)
	if err != nil {
		return err
	}
	if f.jsonOut {
		out := make([]map[string]any, len(ps))
		for i, p := range ps {
			out[i] = pauseJSON(p.Consumer, p.Pause, nil)
		}
		return printJSON(stdout, map[string]any{"table": f.table, "paused": out})
	}
	if len(ps) == 0 {
		_, err = fmt.Fprintf(stdout, "no consumer of %s is paused\n", f.table)
		return err
	}
	for _, p := range ps {
		if _, err := fmt.Fprintf(stdout, "%s  paused %s\n", p.Consumer, pauseLine(p.Pause)); err != nil {
			return err
		}
	}
	return nil
}

// pauseLine is a pause in words: "since <time> by <who>: <why>".
func pauseLine(p idemstore.Pause) string {
	return fmt.Sprintf("since %s by %s: %s", p.Since.UTC().Format(time.RFC3339), p.By, p.Why)
}

// pauseJSON is a pause as JSON, with more fields.
func pauseJSON(consumer string, p idemstore.Pause, more map[string]any) map[string]any {
	out := map[string]any{"consumer": consumer, "paused": p.Paused}
	if p.Paused || !p.Since.IsZero() {
		out["since"], out["by"], out["why"] = p.Since.UTC(), p.By, p.Why
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// currentUser is the name of the user running idem, or "".
func currentUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

// flagGiven reports whether flag name was on fs's command line.
func flagGiven(fs *cmdFlags, name string) bool {
	set := false
	fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}
