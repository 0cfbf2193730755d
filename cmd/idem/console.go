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
	"github.com/idemkit/idem/cmd/idem/internal/console"
	"github.com/idemkit/idem/dlq"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() {
	register(command{name: "console", summary: "a web console: consumers, dead letters (show, redrive), guarded tables", run: runConsole})
}

const consoleDoc = `Serves a small web console on --listen (127.0.0.1 by default): per consumer of the
inbox, the markers, the oldest marker against the window, markers per hour and day and
the untimed ones; the dead letters of each --queue, --topic and --stream grouped by reason, with
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
	o, err := parseConsole(args, stdout)
	if err != nil {
		return err
	}
	pool, err := o.f.db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := o.open(ctx, pool, stderr)
	if err != nil {
		return err
	}
	defer c.Close()
	return o.serve(ctx, c, stdout, stderr)
}

// consoleOpts are idem console's flags, parsed and checked.
type consoleOpts struct {
	f                     *dlqFlags
	queues, topics, hosts listFlag
	streams               listFlag // NATS JetStream or Redis dead-letter streams
	guards                guardFlag
	listen, host, token   string
	readOnly              bool
	cacheFor              time.Duration
	rate                  float64
}

// parseConsole parses and checks idem console's flags; the token defaults
// to $IDEM_CONSOLE_TOKEN.
func parseConsole(args []string, stdout io.Writer) (*consoleOpts, error) {
	o := &consoleOpts{f: &dlqFlags{inbox: true}}
	f := o.f
	f.fs = newCmdFlags("console", "[--queue Q,...] [--topic T,...] [--stream S,...] [--guard table:key,...] [--token T | $IDEM_CONSOLE_TOKEN] [flags]", consoleDoc, stdout)
	fs := f.fs
	fs.Var(&o.queues, "queue", "RabbitMQ dead-letter queue to show, comma-separated or repeated")
	fs.Var(&o.topics, "topic", "Kafka dead-letter topic to show, comma-separated or repeated (needs --brokers)")
	fs.Var(&o.streams, "stream", "NATS JetStream (on --nats) or Redis (on --redis) dead-letter stream to show, comma-separated or repeated")
	f.addSource()
	f.addInbox("inbox table, optionally schema-qualified")
	fs.Var(&o.guards, "guard", "guarded table whose audit check is shown, table:key[,key] with audit check's column defaults (id, created_at, status), or table:key;status=-;id=-;time=C;void=V; repeatable")
	fs.Var(&o.hosts, "allow-host", "host name the console answers to besides IP addresses and localhost (a proxy's), comma-separated or repeated; any other Host is refused")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve on; anything but a loopback address exposes the console to the network")
	fs.StringVar(&o.token, "token", "", "token that allows actions (default $IDEM_CONSOLE_TOKEN; none: the console only reads)")
	fs.BoolVar(&o.readOnly, "read-only", false, "refuse every action, even with a token")
	fs.DurationVar(&o.cacheFor, "cache", 5*time.Second, "how long a read of a DLQ is shown before the next page reads it again (a read spends no delivery, but a RabbitMQ read goes round the whole queue)")
	fs.Float64Var(&o.rate, "rate", 100, "republishes per second at most in a redrive (0: no limit)")
	if err := fs.parse(args, false); err != nil {
		return nil, err
	}
	switch {
	case len(o.topics) > 0 && f.brokerList() == nil:
		return nil, fs.usagef("--topic needs --brokers (or IDEM_KAFKA_BROKERS)")
	case o.cacheFor < 0:
		return nil, fs.usagef("--cache must not be negative")
	case o.rate < 0:
		return nil, fs.usagef("--rate must not be negative (0: no limit)")
	}
	if err := f.checkInbox(); err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil {
		return nil, fs.usagef("--listen %q: want host:port (127.0.0.1:8080)", o.listen)
	}
	o.host = host
	if o.token == "" {
		o.token = os.Getenv("IDEM_CONSOLE_TOKEN")
	}
	return o, nil
}

// open makes the console over pool: the inbox (whose settings must read),
// a source per DLQ and an auditor per guarded table. The console closes
// the sources; on an error, open does.
func (o *consoleOpts) open(ctx context.Context, pool *pgxpool.Pool, stderr io.Writer) (*console.Server, error) {
	f := o.f
	in, err := dlq.NewInbox(pool, &dlq.InboxConfig{Table: f.table, Consumer: f.consumer, Key: f.keyFunc, MaxAhead: f.ahead, RefuseUntimed: f.untimed})
	if err != nil {
		return nil, err
	}
	if _, err := in.Settings(ctx); err != nil {
		return nil, err
	}
	var srcs []dlq.Source
	defer func() {
		for _, s := range srcs {
			_ = s.Close()
		}
	}()
	for _, q := range o.queues {
		f.queue, f.topic = q, ""
		s, err := f.source(ctx)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, s)
	}
	for _, tp := range o.topics {
		f.queue, f.topic = "", tp
		s, err := f.source(ctx)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, s)
	}
	for _, st := range o.streams {
		f.queue, f.topic, f.stream = "", "", st
		s, err := f.source(ctx)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, s)
	}
	var auditors []*audit.Auditor
	for _, sp := range o.guards.specs {
		a, err := audit.New(pool, sp)
		if err != nil {
			return nil, f.fs.usagef("--guard %s: %s", sp.Table, auditFlagTerms(err.Error()))
		}
		auditors = append(auditors, a)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	// The consumers page pauses and resumes the inbox's consumers (its
	// statements are the same in either layout).
	pauses, err := pgxinbox.New(pool, &pgxinbox.Config{Table: f.table, Logger: logger})
	if err != nil {
		return nil, err
	}
	c, err := console.New(console.Config{Inbox: in, DB: pool, Pauses: pauses, Sources: srcs, Guards: auditors, Token: o.token, ReadOnly: o.readOnly,
		Hosts: o.hosts, CacheFor: o.cacheFor, Rate: o.rate, Logger: logger})
	if err != nil {
		return nil, err
	}
	srcs = nil // the console closes them
	return c, nil
}

// serve serves c on --listen until ctx ends, then shuts the server down,
// giving requests in flight 10 seconds. The serving line says the address,
// whether actions are allowed, and the database.
func (o *consoleOpts) serve(ctx context.Context, c *console.Server, stdout, stderr io.Writer) error {
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.listen, err)
	}
	mode := "actions allowed with the token"
	switch {
	case o.readOnly:
		mode = "read-only (--read-only)"
	case o.token == "":
		mode = "read-only (no --token or IDEM_CONSOLE_TOKEN)"
	}
	if ip := net.ParseIP(o.host); (ip == nil || !ip.IsLoopback()) && o.host != "localhost" {
		fmt.Fprintf(stderr, "idem console: warning: --listen %s is not a loopback address: anyone who reaches it sees the dead letters' bodies\n", o.listen)
	}
	fmt.Fprintf(stdout, "idem console: serving http://%s/ (%s); database: PostgreSQL %s\n", ln.Addr(), mode, redactURL(databaseURL(o.f.db.database)))
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
	return srv.Shutdown(sctx)
}
