package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/dlq"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/reconcile"
)

func init() {
	register(command{name: "reconcile", summary: "find (and --repair) messages a consumer acknowledged but never applied", run: runReconcile})
}

const reconcileDoc = `Compares a source of truth with the consumer's inbox for a time range and
reports every message the source sent whose marker the consumer does not
hold: missing, by ID, time and position. Each message is judged by the
consumer's own rules (its key, window and horizon: --key, --max-ahead,
--refuse-untimed, as the consumer's Config says): a key whose marker another
message ID wrote is applied (a business key); a message older than the
stored window is reported beyond the window and a pruned key probably
applied, never missing.

Sources (--source):
  outbox  the producer's outbox table (--outbox-table; --destination and
          --routing-key keep the consumer's rows): the rows the broker confirmed
  kafka   the consumer's topic (--topic, --brokers), by record time or by
          --from-offset/--to-offset on every partition; reads records, commits nothing
  ids     a file of message IDs (--ids, "-" for stdin), one a line, optionally
          followed by an RFC 3339 time; for a producer without an outbox

--repair redelivers exactly the missing messages to the consumer's own queue
(--queue, through RabbitMQ's default exchange, each publish confirmed) or
topic (--topic, acks from every in-sync replica), at most --rate a second, and
records the run in the operators' audit table idem_dlq_actions (--by, --why).
The payload is the outbox row or the Kafka record; an ID file has none, so a
repair from it is refused. The consumer's inbox applies each message once;
run the check again to see 0 missing.

--every runs the check as a job and serves idem_reconcile_missing{consumer}
and idem_reconcile_last_run_timestamp_seconds{consumer} on --listen.

Exit status 1 when anything is missing (also after a repair: it was).`

// reconcileFlags are the flags of idem reconcile.
type reconcileFlags struct {
	fs          *cmdFlags
	db          dbFlags
	consumer    string
	table       string
	key         string
	ahead       time.Duration
	untimed     bool
	refuseLate  bool
	source      string
	outboxTable string
	destination string
	routingKey  string
	ids         string
	topic       string
	brokers     string
	idHeader    string
	timeHeader  string
	fromOffset  int64
	toOffset    int64
	from, to    string
	settle      time.Duration
	queue       string
	amqpURL     string
	repair      bool
	rate        float64
	by, why     string
	every       time.Duration
	listen      string
	jsonOut     bool

	keyFunc idem.KeyFunc
}

func newReconcileFlags(stdout io.Writer) *reconcileFlags {
	f := &reconcileFlags{fs: newCmdFlags("reconcile", "--consumer C --source outbox|kafka|ids [flags]", reconcileDoc, stdout)}
	fs := f.fs
	f.db.add(fs.FlagSet)
	fs.StringVar(&f.consumer, "consumer", "", "the consumer to reconcile (its Config.Consumer); required")
	fs.StringVar(&f.table, "table", "idem_inbox", "inbox table, optionally schema-qualified")
	fs.StringVar(&f.key, "key", "id", keyDoc)
	fs.DurationVar(&f.ahead, "max-ahead", time.Hour, "the consumer's horizon MaxAhead: an event time further ahead is not trusted")
	fs.BoolVar(&f.untimed, "refuse-untimed", false, "the consumer refuses untimed messages (Config.RefuseUntimed)")
	fs.BoolVar(&f.refuseLate, "refuse-late", false, "the consumer refuses late duplicates (Config.RefuseLate)")
	fs.StringVar(&f.source, "source", "", "the source of truth: outbox, kafka or ids; required")
	fs.StringVar(&f.outboxTable, "outbox-table", "idem_outbox", "outbox table (--source outbox), in the inbox's database")
	fs.StringVar(&f.destination, "destination", "", "--source outbox: keep the rows of this topic or exchange")
	fs.StringVar(&f.routingKey, "routing-key", "", "--source outbox: keep the rows with this RabbitMQ routing key")
	fs.StringVar(&f.ids, "ids", "", "--source ids: the file of message IDs (- for stdin)")
	fs.StringVar(&f.topic, "topic", "", "the consumer's Kafka topic: the source (--source kafka) and where --repair produces")
	fs.StringVar(&f.brokers, "brokers", "", "Kafka seed brokers, comma-separated (default $IDEM_KAFKA_BROKERS)")
	fs.StringVar(&f.idHeader, "id-header", "", "Kafka: the header carrying the message ID (default idem-message-id)")
	fs.StringVar(&f.timeHeader, "time-header", "", "Kafka: the producers' event-time header (default x-event-time)")
	fs.Int64Var(&f.fromOffset, "from-offset", -1, "--source kafka: read every partition from this offset instead of --from (-1: by time)")
	fs.Int64Var(&f.toOffset, "to-offset", -1, "--source kafka: stop every partition before this offset (-1: its end)")
	fs.StringVar(&f.from, "from", "24h", "start of the range: an RFC 3339 time, or a duration before now (24h)")
	fs.StringVar(&f.to, "to", "", "end of the range (excluded): an RFC 3339 time, or a duration before now; default now minus --settle")
	fs.DurationVar(&f.settle, "settle", time.Minute, "without --to, leave out the last messages, still in flight to the consumer")
	fs.StringVar(&f.queue, "queue", "", "the consumer's RabbitMQ queue, where --repair redelivers")
	fs.StringVar(&f.amqpURL, "amqp", "", "RabbitMQ URL (default $IDEM_AMQP_URL, else "+defaultAMQPURL+")")
	fs.BoolVar(&f.repair, "repair", false, "redeliver the missing messages to --queue or --topic")
	fs.Float64Var(&f.rate, "rate", 100, "--repair: at most this many redeliveries a second")
	fs.StringVar(&f.by, "by", "", "--repair: who repairs, for the audit table (default the OS user)")
	fs.StringVar(&f.why, "why", "", "--repair: why, for the audit table")
	fs.DurationVar(&f.every, "every", 0, "run again at this interval and serve /metrics (for example 24h); 0: run once")
	fs.StringVar(&f.listen, "listen", ":9466", "address for /metrics with --every")
	fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	return f
}

// brokerList is --brokers, else IDEM_KAFKA_BROKERS.
func (f *reconcileFlags) brokerList() []string {
	s := f.brokers
	if s == "" {
		s = os.Getenv("IDEM_KAFKA_BROKERS")
	}
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

func (f *reconcileFlags) parse(args []string) error {
	if err := f.fs.parse(args, false); err != nil {
		return err
	}
	fs := f.fs
	switch {
	case strings.TrimSpace(f.consumer) == "":
		return fs.usagef("--consumer is required: the consumer whose inbox is reconciled")
	case f.source != "outbox" && f.source != "kafka" && f.source != "ids":
		return fs.usagef("--source %q: want outbox, kafka or ids", f.source)
	case f.source == "ids" && f.ids == "":
		return fs.usagef("--source ids needs --ids FILE (- for stdin)")
	case f.source == "ids" && f.repair:
		return fs.usagef("--repair is refused for --source ids: an ID file carries no payload to redeliver; reconcile against the outbox or the Kafka topic, or redeliver from the producer")
	case f.source == "kafka" && f.topic == "":
		return fs.usagef("--source kafka needs --topic")
	case (f.source == "kafka" || (f.repair && f.topic != "")) && f.brokerList() == nil:
		return fs.usagef("--topic needs --brokers (or IDEM_KAFKA_BROKERS)")
	case f.source != "kafka" && (f.fromOffset >= 0 || f.toOffset >= 0):
		return fs.usagef("--from-offset and --to-offset are for --source kafka")
	case f.repair && f.queue == "" && f.topic == "":
		return fs.usagef("--repair needs the consumer's own --queue (RabbitMQ) or --topic (Kafka) to redeliver to")
	case f.repair && f.queue != "" && f.topic != "":
		return fs.usagef("--queue and --topic name two places to redeliver to: give one")
	case f.repair && f.rate <= 0:
		return fs.usagef("--rate must be positive (got %v)", f.rate)
	case f.every < 0:
		return fs.usagef("--every must be positive (0: run once)")
	case f.settle < 0:
		return fs.usagef("--settle must not be negative")
	case f.ahead <= 0 || f.ahead > time.Hour:
		return fs.usagef("--max-ahead %v: want more than 0 and at most 1h, as the consumer's horizon", f.ahead)
	case !tableName.MatchString(f.table):
		return fs.usagef("--table %q: want a table name, optionally schema.table", f.table)
	case !tableName.MatchString(f.outboxTable):
		return fs.usagef("--outbox-table %q: want a table name, optionally schema.table", f.outboxTable)
	}
	if _, _, err := f.window(time.Now()); err != nil {
		return err
	}
	if strings.TrimSpace(f.key) == "" {
		return fs.usagef("--key is empty: %s", keyDoc)
	}
	k, err := dlq.ParseKey(f.key)
	if err != nil {
		return fs.usagef("--key: %v", err)
	}
	f.keyFunc = k
	if f.repair && f.by == "" {
		f.by = os.Getenv("USER")
		if u, err := user.Current(); err == nil && u.Username != "" {
			f.by = u.Username
		}
		if f.by == "" {
			return fs.usagef("--by is required with --repair (no user name found)")
		}
	}
	return f.db.validate()
}

// window resolves --from and --to at now.
func (f *reconcileFlags) window(now time.Time) (reconcile.Range, time.Time, error) {
	at := func(name, v string) (time.Time, error) {
		if v == "" {
			return time.Time{}, nil
		}
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t, nil
		}
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			return now.Add(-d), nil
		}
		return time.Time{}, f.fs.usagef("--%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration before now (24h)", name, v)
	}
	from, err := at("from", f.from)
	if err != nil {
		return reconcile.Range{}, now, err
	}
	to, err := at("to", f.to)
	if err != nil {
		return reconcile.Range{}, now, err
	}
	if f.to == "" {
		to = now.Add(-f.settle)
	}
	if !from.IsZero() && !to.After(from) {
		return reconcile.Range{}, now, f.fs.usagef("--from %s is not before --to %s", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	return reconcile.Range{From: from, To: to}, now, nil
}

// reconcileRun is what one run prints.
type reconcileRun struct {
	reconcile.Report
	Repaired *reconcile.Repaired `json:"repaired,omitempty"`
	Audit    *int64              `json:"audit_id,omitempty"`
}

// MarshalJSON writes the report's fields, in order, with the repair's
// after them (the report's own MarshalJSON would otherwise be the run's).
func (r reconcileRun) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.Report)
	if err != nil {
		return nil, err
	}
	if r.Repaired == nil && r.Audit == nil {
		return b, nil
	}
	b = b[:len(b)-1] // the closing brace
	if r.Repaired != nil {
		rb, err := json.Marshal(r.Repaired)
		if err != nil {
			return nil, err
		}
		b = append(append(b, `,"repaired":`...), rb...)
	}
	if r.Audit != nil {
		b = fmt.Appendf(b, `,"audit_id":%d`, *r.Audit)
	}
	return append(b, '}'), nil
}

func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newReconcileFlags(stdout)
	if err := f.parse(args); err != nil {
		return err
	}
	pool, err := f.db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	judge, err := f.judge(ctx, pool)
	if err != nil {
		return err
	}
	src, err := f.sourceOf(pool)
	if err != nil {
		return err
	}
	if f.every == 0 {
		run, err := f.once(ctx, pool, judge, src, stderr)
		if err != nil {
			return err
		}
		if err := f.print(stdout, run); err != nil {
			return err
		}
		if len(run.Missing) > 0 {
			return &exitError{code: exitFindings}
		}
		return nil
	}
	return f.watch(ctx, pool, judge, src, stdout, stderr)
}

// judge is the consumer's processor over the inbox table, laid out as the
// table is, with the rules the flags say the consumer has.
func (f *reconcileFlags) judge(ctx context.Context, pool *pgxpool.Pool) (*idem.Processor[pgx.Tx], error) {
	st, err := pgxinbox.New(pool, &pgxinbox.Config{Table: f.table})
	if err != nil {
		return nil, err
	}
	set, err := st.Settings(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the settings of inbox %s: %w", f.table, err)
	}
	if set.Layout == idemstore.LayoutPartitioned {
		if st, err = pgxinbox.New(pool, &pgxinbox.Config{Table: f.table, Layout: pgxinbox.Partitioned}); err != nil {
			return nil, err
		}
	}
	p, err := idem.NewProcessor(st, &idem.Config[pgx.Tx]{
		Consumer: f.consumer,
		Key:      f.keyFunc,
		Handler: func(context.Context, pgx.Tx, idem.Message) error {
			return errors.New("reconcile: a judge runs no handler")
		},
		RefuseUntimed: f.untimed,
		RefuseLate:    f.refuseLate,
		Horizon:       idem.Horizon{MaxAhead: f.ahead},
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, fmt.Errorf("building the judge of consumer %s: %w", f.consumer, err)
	}
	return p, nil
}

// sourceOf builds the source the flags name.
func (f *reconcileFlags) sourceOf(pool *pgxpool.Pool) (reconcile.Source, error) {
	switch f.source {
	case "outbox":
		ob, err := outbox.NewPgx(pool, &outbox.Config{Table: f.outboxTable})
		if err != nil {
			return nil, err
		}
		return &reconcile.Outbox{Rows: ob, Destination: f.destination, RoutingKey: f.routingKey}, nil
	case "kafka":
		k := &reconcile.Kafka{Brokers: f.brokerList(), Topic: f.topic, IDHeader: f.idHeader, TimeHeader: f.timeHeader}
		if f.fromOffset >= 0 || f.toOffset >= 0 {
			k.Offsets = &reconcile.Offsets{From: max(f.fromOffset, 0), To: f.toOffset}
		}
		return k, nil
	default:
		return &idFile{path: f.ids}, nil
	}
}

// idFile opens the ID file afresh for each run.
type idFile struct{ path string }

func (s *idFile) Name() string   { return "id file " + s.path }
func (s *idFile) Payloads() bool { return false }
func (s *idFile) Read(ctx context.Context, r reconcile.Range, page func([]reconcile.Candidate) error) error {
	in := io.Reader(os.Stdin)
	if s.path != "-" {
		fh, err := os.Open(s.path)
		if err != nil {
			return err
		}
		defer fh.Close()
		in = fh
	}
	return (&reconcile.IDFile{Path: s.path, R: in}).Read(ctx, r, page)
}

// once checks, and repairs with --repair.
func (f *reconcileFlags) once(ctx context.Context, pool *pgxpool.Pool, judge reconcile.Judge, src reconcile.Source, stderr io.Writer) (*reconcileRun, error) {
	r, _, err := f.window(time.Now())
	if err != nil {
		return nil, err
	}
	rep, err := reconcile.Check(ctx, src, judge, r)
	if err != nil {
		return nil, err
	}
	run := &reconcileRun{Report: rep}
	if !f.repair || len(rep.Missing) == 0 {
		return run, nil
	}
	repaired, repErr := f.redeliver(ctx, &rep, stderr)
	run.Repaired = &repaired
	id, auditErr := f.audit(ctx, pool, &rep, &repaired, repErr)
	if auditErr == nil {
		run.Audit = &id
	}
	if repErr != nil {
		return run, fmt.Errorf("repair stopped after %d of %d messages: %w", len(repaired.Sent), len(rep.Missing), errors.Join(repErr, auditErr))
	}
	if auditErr != nil {
		return run, fmt.Errorf("repaired %d messages but could not record it: %w", len(repaired.Sent), auditErr)
	}
	return run, nil
}

// redeliver publishes the missing messages to the consumer's queue or topic.
func (f *reconcileFlags) redeliver(ctx context.Context, rep *reconcile.Report, stderr io.Writer) (reconcile.Repaired, error) {
	cfg := reconcile.RepairConfig{Rate: f.rate, Logger: slog.New(slog.NewTextHandler(stderr, nil))}
	if f.queue != "" {
		url := f.amqpURL
		if url == "" {
			url = os.Getenv("IDEM_AMQP_URL")
		}
		if url == "" {
			url = defaultAMQPURL
		}
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(f.db.connectTimeout)})
		if err != nil {
			return reconcile.Repaired{Sent: []string{}}, fmt.Errorf("connecting to RabbitMQ %s: %w", redactURL(url), err)
		}
		defer conn.Close()
		// The queue must exist: a redelivery nobody receives is no repair.
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDeclarePassive(f.queue, true, false, false, false, nil)
			_ = ch.Close()
		}
		if err != nil {
			return reconcile.Repaired{Sent: []string{}}, fmt.Errorf("queue %s: %w", f.queue, err)
		}
		pub, err := amqppub.New(conn, nil)
		if err != nil {
			return reconcile.Repaired{Sent: []string{}}, err
		}
		defer pub.Close()
		cfg.Publisher, cfg.RoutingKey = pub, f.queue
	} else {
		opts := append([]kgo.Opt{kgo.SeedBrokers(f.brokerList()...)}, kafkapub.ProducerOptions()...)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return reconcile.Repaired{Sent: []string{}}, err
		}
		defer cl.Close()
		pub, err := kafkapub.New(cl, &kafkapub.Config{IDHeader: f.idHeader, TimeHeader: f.timeHeader})
		if err != nil {
			return reconcile.Repaired{Sent: []string{}}, err
		}
		cfg.Publisher, cfg.Destination = pub, f.topic
	}
	return reconcile.Repair(ctx, rep, cfg)
}

// audit records the repair in the operators' audit table, idem_dlq_actions
// beside the inbox table.
func (f *reconcileFlags) audit(ctx context.Context, pool *pgxpool.Pool, rep *reconcile.Report, repaired *reconcile.Repaired, runErr error) (int64, error) {
	in, err := dlq.NewInbox(pool, &dlq.InboxConfig{Table: f.table, Key: f.keyFunc, Consumer: f.consumer})
	if err != nil {
		return 0, err
	}
	target := "queue " + f.queue
	if f.queue == "" {
		target = "topic " + f.topic
	}
	res := dlq.Result{DLQ: "reconcile " + f.consumer + " from " + rep.Source + " to " + target, Matched: len(rep.Missing), Done: len(repaired.Sent)}
	for _, id := range repaired.Sent {
		res.Items = append(res.Items, dlq.Item{ID: id, Target: target, Action: "redeliver", Done: true, Sent: true})
	}
	ctx = context.WithoutCancel(ctx)
	a, err := in.Record(ctx, f.by, f.why, "idem reconcile", "reconcile-repair", res, runErr)
	return a.ID, err
}

func (f *reconcileFlags) print(w io.Writer, run *reconcileRun) error {
	if f.jsonOut {
		b, err := json.Marshal(run)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	rep := &run.Report
	span := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	state := "OK"
	if len(rep.Missing) > 0 {
		state = "MISSING"
	}
	fmt.Fprintf(w, "%s %s consumer %s, %s, %s to %s: %d checked, %d missing, %d applied", span(rep.At), state, rep.Consumer, rep.Source,
		span(rep.From), span(rep.To), rep.Checked, len(rep.Missing), rep.Counts[reconcile.Applied])
	for s := reconcile.AppliedAs; s <= reconcile.Invalid; s++ {
		if s != reconcile.Missing && rep.Counts[s] > 0 {
			fmt.Fprintf(w, ", %d %s", rep.Counts[s], strings.ReplaceAll(s.String(), "_", " "))
		}
	}
	fmt.Fprintln(w)
	if len(rep.Missing)+len(rep.Other) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STATUS\tID\tTIME\tPOSITION\tKEY\tNOTE")
		for _, l := range [][]reconcile.Finding{rep.Missing, rep.Other} {
			for _, x := range l {
				note := x.Why
				if x.By != "" {
					note = "applied as " + x.By
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", x.Status, x.ID, span(x.Time), x.Position, x.Key, note)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if run.Repaired != nil {
		fmt.Fprintf(w, "repaired: %d of %d redelivered and confirmed", len(run.Repaired.Sent), len(rep.Missing))
		if run.Audit != nil {
			fmt.Fprintf(w, " (audit row %d in %s)", *run.Audit, dlq.ActionsTable)
		}
		fmt.Fprintln(w, "; run again to see what the consumer applied")
	}
	return nil
}

// watch runs once every f.every and serves the results as gauges. It
// returns nil when ctx ends (SIGINT, SIGTERM).
func (f *reconcileFlags) watch(ctx context.Context, pool *pgxpool.Pool, judge reconcile.Judge, src reconcile.Source, stdout, stderr io.Writer) error {
	reg := prometheus.NewRegistry()
	metrics := idemprom.NewReconcile(reg)
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listening on %s for /metrics: %w", f.listen, err)
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
	fmt.Fprintf(stderr, "idem reconcile: every %s, metrics on http://%s/metrics\n", f.every, ln.Addr())
	for {
		run, err := f.once(ctx, pool, judge, src, stderr)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && run == nil:
			// Nothing known: the metrics stay as they were, and the last
			// run's time shows how old they are.
			fmt.Fprintf(stderr, "%s reconcile failed: %v\n", time.Now().UTC().Format(time.RFC3339), err)
		default:
			if err != nil {
				fmt.Fprintf(stderr, "%s %v\n", time.Now().UTC().Format(time.RFC3339), err)
			}
			metrics.Observe(f.consumer, len(run.Missing), time.Now())
			_ = f.print(stdout, run)
		}
		t := time.NewTimer(f.every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case err := <-served:
			t.Stop()
			return fmt.Errorf("serving /metrics: %w", err)
		case <-t.C:
		}
	}
}
