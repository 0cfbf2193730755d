// Package demo replays the billing incident told in docs/design.md side by
// side: a broker restart redelivers the deliveries a consumer had processed but
// not acknowledged, and a producer republishes some events with the same ID. A
// naive consumer (no inbox, no constraint, a charge without a key) and an idem
// consumer receive the same deliveries from the same broker; [Run] measures
// what each did to its database and to the payment gateway.
//
// The default run needs no services: Kafka in process (kfake) and SQLite
// files in a temporary directory. Options name a real PostgreSQL, RabbitMQ,
// MySQL/MariaDB or Kafka instead. `idem demo` is the command line of this
// package.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/examples/billing"
	"github.com/idemkit/idem/sqlinbox"
)

// Options configures [Run]. The zero value replays the incident at its size
// on kfake and SQLite.
type Options struct {
	// Renewals is the number of SubscriptionRenewed events, one customer
	// each, between [MinRenewals] and [MaxRenewals]. Half as many orders
	// come with them. Zero means 3,100, the incident's count of
	// unacknowledged messages; a command line that takes the number from
	// its user checks it with [CheckRenewals] first, so that 0 is refused
	// there rather than replaced.
	Renewals int
	// Seed is the random seed of the generated events and of which of them
	// are republished: the same seed publishes the same messages. What the
	// broker restart catches unacknowledged depends on timing, so the
	// redelivery counts differ between runs of one seed; the verdict does
	// not. Every value is a seed, 0 included (`idem demo` defaults to 1).
	Seed int64
	// Postgres is a postgres:// URL. The demo drops and recreates the
	// schemas <SchemaPrefix>_naive and <SchemaPrefix>_idem there and leaves
	// them for inspection. Empty uses SQLite.
	Postgres string
	// MySQL is a MySQL or MariaDB DSN in the driver's form,
	// user:password@tcp(host:3306)/database (as mysqlinbox.Open takes it;
	// the database is the one connected to first). The demo drops and
	// recreates the databases <SchemaPrefix>_naive and <SchemaPrefix>_idem
	// on that server and leaves them for inspection.
	MySQL string
	// SQLiteDir, without Postgres or MySQL, is the directory of the two SQLite files
	// (naive.db and idem.db, replaced if they exist), kept after the run for
	// inspection. Empty uses a temporary directory removed at the end.
	SQLiteDir string
	// ConnectTimeout bounds each connection attempt to PostgreSQL and
	// RabbitMQ: a server that accepts connections but never answers fails
	// the run after it. Defaults to 10 seconds; negative means no limit.
	ConnectTimeout time.Duration
	// SchemaPrefix names the PostgreSQL schemas, or the MySQL databases.
	// Defaults to "idem_demo".
	SchemaPrefix string
	// RabbitMQ is an amqp:// URL. The demo declares its exchanges and queues
	// (names with a random suffix) and deletes them at the end.
	RabbitMQ string
	// Kafka lists the brokers of a real cluster; the demo creates topics
	// with a random suffix. Empty, with RabbitMQ empty too, starts kfake.
	Kafka []string
	// Republish is the share of events the producer publishes a second time
	// with the same event ID. Defaults to 0.05. Negative disables it.
	Republish float64
	// OutageAfter is the share of each stream acknowledged normally before
	// the broker restart begins. Defaults to 0.10.
	OutageAfter float64
	// OutageHeld is the share of each stream that the restart catches
	// processed but unacknowledged. Defaults to 0.35.
	OutageHeld float64
	// Timeout bounds the consuming phase. Defaults to 3 minutes.
	Timeout time.Duration
	// Progress, when set, is called about ten times a second while the
	// demo runs.
	Progress func(Progress)
	// Logger receives the adapters' and processors' logs (restarts,
	// reconnects, duplicates skipped). Defaults to discarding them: the
	// report tells the story.
	Logger *slog.Logger
}

// Progress is a snapshot of a running demo.
type Progress struct {
	// Phase is what happens now: "publishing", "consuming", "restarting"
	// (acknowledgements are being held and connections cut), "redelivering"
	// (every consumer went through its restart).
	Phase string
	// Done and Total count deliveries acknowledged by both sides' consumers
	// out of the messages published to them.
	Done, Total int
	// Restarts counts consumers whose broker restart has happened, of
	// Consumers.
	Restarts, Consumers int
}

func (o *Options) setDefaults() {
	if o.Renewals == 0 {
		o.Renewals = 3100
	}
	if o.SchemaPrefix == "" {
		o.SchemaPrefix = "idem_demo"
	}
	if o.Republish == 0 {
		o.Republish = 0.05
	}
	if o.Republish < 0 {
		o.Republish = 0
	}
	if o.OutageAfter == 0 {
		o.OutageAfter = 0.10
	}
	if o.OutageHeld == 0 {
		o.OutageHeld = 0.35
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.ConnectTimeout < 0 {
		o.ConnectTimeout = 0
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Validate reports what is wrong with opts, defaults applied, without
// running anything: the mistakes [Run] would refuse.
func (o Options) Validate() error {
	o.setDefaults()
	return o.validate()
}

// The bounds of [Options.Renewals].
const (
	MinRenewals = 10
	MaxRenewals = 1_000_000
)

// CheckRenewals refuses a number of renewals outside [MinRenewals] and
// [MaxRenewals], 0 included: unlike [Options.Renewals], it never reads 0
// as the default.
func CheckRenewals(n int) error {
	if n < MinRenewals || n > MaxRenewals {
		return fmt.Errorf("the number of renewals (--events) must be between 10 and 1,000,000, got %d", n)
	}
	return nil
}

func (o *Options) validate() error {
	var errs []error
	if err := CheckRenewals(o.Renewals); err != nil {
		errs = append(errs, err)
	}
	if o.Republish > 1 || o.OutageAfter < 0 || o.OutageAfter > 1 || o.OutageHeld < 0 || o.OutageHeld > 1 {
		errs = append(errs, errors.New("republish and outage shares must be between 0 and 1"))
	}
	if o.RabbitMQ != "" && len(o.Kafka) > 0 {
		errs = append(errs, errors.New("choose RabbitMQ or Kafka, not both"))
	}
	if o.Postgres != "" {
		if u, err := url.Parse(o.Postgres); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			errs = append(errs, fmt.Errorf("the PostgreSQL URL must be postgres://user@host:port/database, got %q", redact(o.Postgres)))
		}
	}
	if o.RabbitMQ != "" {
		if u, err := url.Parse(o.RabbitMQ); err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") {
			errs = append(errs, fmt.Errorf("the RabbitMQ URL must be amqp://user:password@host:port/, got %q", redact(o.RabbitMQ)))
		}
	}
	if o.Postgres != "" && o.SQLiteDir != "" {
		errs = append(errs, errors.New("choose PostgreSQL or a SQLite directory, not both"))
	}
	if o.MySQL != "" {
		if o.Postgres != "" {
			errs = append(errs, errors.New("choose PostgreSQL or MySQL, not both"))
		}
		if o.SQLiteDir != "" {
			errs = append(errs, errors.New("choose MySQL or a SQLite directory, not both"))
		}
		if strings.Contains(o.MySQL, "://") {
			errs = append(errs, errors.New("the MySQL DSN takes the driver's form user:password@tcp(host:3306)/database, not a URL"))
		} else if _, err := mysql.ParseDSN(o.MySQL); err != nil {
			errs = append(errs, fmt.Errorf("the MySQL DSN must be user:password@tcp(host:3306)/database: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Run replays the incident and returns what both sides did. An error means
// the demo could not run (a service unreachable, the consumers stuck past
// the timeout); the outcome itself is in the report: see [Report.OK].
func Run(ctx context.Context, opts Options) (*Report, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("demo options: %w", err)
	}
	began := time.Now()
	p := newPlan(opts.Renewals, opts.Seed, opts.Republish)
	progress := func(pr Progress) {
		if opts.Progress != nil {
			opts.Progress(pr)
		}
	}
	progress(Progress{Phase: "publishing", Total: 2 * p.total()})

	naive, safe, closeDBs, err := openSides(ctx, &opts, p)
	if err != nil {
		return nil, err
	}
	defer closeDBs()

	var tr transport
	if opts.RabbitMQ != "" {
		tr, err = newRabbit(opts.RabbitMQ, opts.ConnectTimeout, opts.Logger)
	} else {
		tr, err = newKafka(opts.Kafka, opts.Logger)
	}
	if err != nil {
		return nil, err
	}
	defer tr.close(context.WithoutCancel(ctx))
	if err := tr.prepare(ctx, p); err != nil {
		return nil, err
	}
	if err := tr.publish(ctx, p); err != nil {
		return nil, err
	}

	cctx, stop := context.WithCancel(ctx)
	defer stop()
	type running struct {
		side   *side
		stream string
		c      runningConsumer
		o      *outage
	}
	var all []running
	for _, s := range []*side{naive, safe} {
		for _, stream := range streams {
			n := p.published(stream)
			o := newOutage(int(float64(n)*opts.OutageAfter), int(float64(n)*opts.OutageHeld))
			all = append(all, running{s, stream, tr.start(cctx, s, stream, s.procs[stream], o, n), o})
		}
	}
	// The idem side's charges leave through the outbox. The relay is killed
	// once between charging and marking, as a deploy would: the gateway
	// sees those charges again and answers them from their keys.
	relayDone := make(chan struct{})
	var killOnce sync.Once
	relay := &billing.ChargeRelay{DB: safe.db, Dialect: safe.dialect, Gateway: safe.gateway, BeforeMark: func(int) error {
		err := error(nil)
		killOnce.Do(func() { err = errors.New("relay killed mid-pass") })
		return err
	}}
	go func() {
		defer close(relayDone)
		_ = relay.Run(cctx, 50*time.Millisecond, nil)
	}()

	deadline := time.NewTimer(opts.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var runErr error
wait:
	for {
		pr := Progress{Phase: "consuming", Total: 2 * p.total(), Consumers: len(all)}
		finished, holding := true, false
		for _, r := range all {
			pr.Done += min(r.c.acked(), p.published(r.stream))
			h, over, _ := r.o.state()
			if over {
				pr.Restarts++
			}
			holding = holding || h
			finished = finished && r.c.finished()
		}
		switch {
		case pr.Restarts == len(all):
			pr.Phase = "redelivering"
		case holding || pr.Restarts > 0:
			pr.Phase = "restarting"
		}
		progress(pr)
		if finished {
			break
		}
		select {
		case <-ctx.Done():
			runErr = ctx.Err()
			break wait
		case <-deadline.C:
			runErr = fmt.Errorf("the consumers did not finish within %v (%d of %d deliveries acknowledged)", opts.Timeout, pr.Done, pr.Total)
			break wait
		case <-tick.C:
		}
	}
	stop()
	for _, r := range all {
		if err := r.c.wait(); err != nil && runErr == nil {
			runErr = fmt.Errorf("%s %s consumer: %w", r.side.name, r.stream, err)
		}
	}
	<-relayDone
	if runErr != nil {
		return nil, runErr
	}
	// Send what the relay had not sent yet.
	for {
		n, err := relay.SendPending(context.WithoutCancel(ctx))
		if err != nil {
			return nil, fmt.Errorf("draining the charge outbox: %w", err)
		}
		if n == 0 {
			break
		}
	}

	rep := &Report{
		Broker: tr.describe(), Database: "SQLite", Seed: opts.Seed,
		Renewals: p.renewals, Orders: p.orders, OrderLines: p.lines, Merchants: p.merchants, Products: p.products,
		Published: p.total(), Republished: p.republished, Query: DuplicateInvoiceQuery,
	}
	switch {
	case opts.Postgres != "":
		rep.Database = "PostgreSQL"
	case opts.MySQL != "" && safe.dialect == sqlinbox.MariaDB:
		rep.Database = "MariaDB"
	case opts.MySQL != "":
		rep.Database = "MySQL"
	}
	for _, s := range []*side{naive, safe} {
		sr, err := measure(context.WithoutCancel(ctx), s, p)
		if err != nil {
			return nil, err
		}
		for _, r := range all {
			if r.side == s {
				_, _, held := r.o.state()
				sr.CaughtByRestart += held
			}
		}
		if s.naive {
			rep.Naive = *sr
		} else {
			rep.Idem = *sr
		}
	}
	rep.Elapsed = time.Since(began).Round(10 * time.Millisecond)
	return rep, nil
}
