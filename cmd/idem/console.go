package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem/audit"
	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/dlq"
	"github.com/idemkit/idem/pgxinbox"
)

func init() {
	register(command{name: "console", summary: "a web console: consumers, dead letters (show, redrive), guarded tables", run: runConsole})
}

const consoleDoc = `Serves a small web console on --listen (127.0.0.1 by default): per consumer of the
inbox, the markers, the oldest marker against the window, markers per hour and day and
the untimed ones; the dead letters of each --queue and --topic grouped by reason, with
each letter's verdict (apply, duplicate, expire) and a redrive previewed as a dry run and
confirmed by a form; the audit check of each --guard table; and the actions taken.

The inbox keeps markers, not a log of duplicates: the charts show markers written (from
processed_at), and the dead letters in the DLQs now by the hour of their event time.

The console only reads unless it has a token (--token, or IDEM_CONSOLE_TOKEN, which
keeps it out of the process list). With one, a redrive is a POST that carries the token,
a form token derived from it, and must come from the console's own origin; each leaves
a row in the actions table idem_dlq_actions beside the inbox. --read-only refuses every
action even with a token. Stop it with SIGINT or SIGTERM.`

// guardFlag collects --guard table:col[,col][;name=value...].
type guardFlag struct{ specs []audit.Spec }

func (g *guardFlag) String() string { return "" }

// Set reads table:key1,key2, optionally followed by ;id=C ;time=C
// ;status=C (- for none) ;void=V, for a table whose columns are not audit
// check's defaults.
func (g *guardFlag) Set(v string) error {
	parts := strings.Split(v, ";")
	table, keys, ok := strings.Cut(parts[0], ":")
	if !ok || strings.TrimSpace(table) == "" || len(auditSplit(keys)) == 0 {
		return fmt.Errorf("want table:column[,column] (the business key that must be unique), got %q", v)
	}
	sp := audit.Spec{Table: strings.TrimSpace(table), Key: auditSplit(keys)}
	for _, p := range parts[1:] {
		name, val, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return fmt.Errorf("%q: want name=value after ; (id, time, status or void)", p)
		}
		switch name {
		case "id":
			sp.ID = noColumn(val)
		case "time":
			sp.Time = val
		case "status":
			sp.Status = noColumn(val)
		case "void":
			sp.VoidValue = val
		default:
			return fmt.Errorf("%q: unknown setting %s (want id, time, status or void)", p, name)
		}
	}
	if _, err := audit.New(nil, sp); err != nil {
		return errors.New(auditFlagTerms(err.Error()))
	}
	g.specs = append(g.specs, sp)
	return nil
}

// listFlag collects a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := &dlqFlags{inbox: true}
	f.fs = newCmdFlags("console", "[--queue Q,...] [--topic T,...] [--guard table:key,...] [--token T | $IDEM_CONSOLE_TOKEN] [flags]", consoleDoc, stdout)
	fs := f.fs
	var queues, topics listFlag
	var guards guardFlag
	var hosts listFlag
	fs.Var(&queues, "queue", "RabbitMQ dead-letter queue to show, comma-separated or repeated")
	fs.Var(&topics, "topic", "Kafka dead-letter topic to show, comma-separated or repeated (needs --brokers)")
	f.addSource()
	f.addInbox("inbox table, optionally schema-qualified")
	fs.Var(&guards, "guard", "guarded table whose audit check is shown, table:key[,key] with audit check's column defaults (id, created_at, status), or table:key;status=-;id=-;time=C;void=V; repeatable")
	fs.Var(&hosts, "allow-host", "host name the console answers to besides IP addresses and localhost (a proxy's), comma-separated or repeated; any other Host is refused")
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on; anything but a loopback address exposes the console to the network")
	token := fs.String("token", "", "token that allows actions (default $IDEM_CONSOLE_TOKEN; none: the console only reads)")
	readOnly := fs.Bool("read-only", false, "refuse every action, even with a token")
	cacheFor := fs.Duration("cache", 5*time.Second, "how long a read of a DLQ is shown before the next page reads it again (a read spends no delivery, but a RabbitMQ read goes round the whole queue)")
	rate := fs.Float64("rate", 100, "republishes per second at most in a redrive (0: no limit)")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	switch {
	case len(topics) > 0 && f.brokerList() == nil:
		return fs.usagef("--topic needs --brokers (or IDEM_KAFKA_BROKERS)")
	case *cacheFor < 0:
		return fs.usagef("--cache must not be negative")
	case *rate < 0:
		return fs.usagef("--rate must not be negative (0: no limit)")
	}
	if err := f.checkInbox(); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return fs.usagef("--listen %q: want host:port (127.0.0.1:8080)", *listen)
	}
	if *token == "" {
		*token = os.Getenv("IDEM_CONSOLE_TOKEN")
	}
	pool, err := f.db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	in, err := dlq.NewInbox(pool, &dlq.InboxConfig{Table: f.table, Consumer: f.consumer, Key: f.keyFunc, MaxAhead: f.ahead, RefuseUntimed: f.untimed})
	if err != nil {
		return err
	}
	if _, err := in.Settings(ctx); err != nil {
		return err
	}
	var srcs []dlq.Source
	defer func() {
		for _, s := range srcs {
			_ = s.Close()
		}
	}()
	for _, q := range queues {
		f.queue, f.topic = q, ""
		s, err := f.source(ctx)
		if err != nil {
			return err
		}
		srcs = append(srcs, s)
	}
	for _, tp := range topics {
		f.queue, f.topic = "", tp
		s, err := f.source(ctx)
		if err != nil {
			return err
		}
		srcs = append(srcs, s)
	}
	var auditors []*audit.Auditor
	for _, sp := range guards.specs {
		a, err := audit.New(pool, sp)
		if err != nil {
			return fs.usagef("--guard %s: %s", sp.Table, auditFlagTerms(err.Error()))
		}
		auditors = append(auditors, a)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	// The consumers page pauses and resumes the inbox's consumers (its
	// statements are the same in either layout).
	pauses, err := pgxinbox.New(pool, &pgxinbox.Config{Table: f.table, Logger: logger})
	if err != nil {
		return err
	}
	c, err := console.New(console.Config{Inbox: in, DB: pool, Pauses: pauses, Sources: srcs, Guards: auditors, Token: *token, ReadOnly: *readOnly,
		Hosts: hosts, CacheFor: *cacheFor, Rate: *rate, Logger: logger})
	if err != nil {
		return err
	}
	srcs = nil // the console closes them
	defer c.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *listen, err)
	}
	mode := "actions allowed with the token"
	switch {
	case *readOnly:
		mode = "read-only (--read-only)"
	case *token == "":
		mode = "read-only (no --token or IDEM_CONSOLE_TOKEN)"
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		fmt.Fprintf(stderr, "idem console: warning: --listen %s is not a loopback address: anyone who reaches it sees the dead letters' bodies\n", *listen)
	}
	fmt.Fprintf(stdout, "idem console: serving http://%s/ (%s)\n", ln.Addr(), mode)
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	return nil
}
