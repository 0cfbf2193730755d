// Command peers measures idem side by side with the ways a team guards a
// consumer without it — no guard, the inbox SQL by hand per message, the
// best batched inbox written by hand, Watermill with the inbox SQL in its
// handler — on RabbitMQ, Kafka, NATS JetStream and Redis Streams, with the
// same workload and the same effect, one after another in one run. After every run it checks that
// each message was applied exactly once. It prints a table and writes the
// figures as JSON, from which the chart command draws docs/bench/peers.svg.
//
//	make bench-peers
//	cd bench/peers && go run . -messages 50000 -out ../../docs/bench/peers.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/bench/peers/report"
)

// brokers are the brokers a run can measure, by name, in the order of
// the table.
var brokers = map[string]func() *Broker{"rabbitmq": RabbitMQ}

var brokerOrder = []string{"rabbitmq", "kafka", "nats", "redis"}

// Report is the JSON file's content.
type Report = report.Report

// Machine is what the figures were measured on.
type Machine = report.Machine

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	var opts Options
	fs.IntVar(&opts.Messages, "messages", 50000, "distinct messages per run")
	fs.IntVar(&opts.Dups, "dups", -1, "redeliveries mixed in per run (default: 1% of -messages)")
	fs.IntVar(&opts.Batch, "batch", 100, "messages per transaction of the batched consumers")
	fs.IntVar(&opts.Prefetch, "prefetch", 500, "deliveries in flight")
	fs.StringVar(&opts.AMQPURL, "amqp", env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL (env IDEM_AMQP_URL)")
	kafka := fs.String("kafka-brokers", os.Getenv("IDEM_KAFKA_BROKERS"), "Kafka seed brokers, comma-separated (env IDEM_KAFKA_BROKERS); empty: an in-process kfake cluster")
	fs.StringVar(&opts.NATSURL, "nats", os.Getenv("IDEM_NATS_URL"), "NATS server URL (env IDEM_NATS_URL); empty: an embedded nats-server with JetStream")
	fs.StringVar(&opts.RedisAddr, "redis", env("IDEM_REDIS_ADDR", "127.0.0.1:6379"), "Redis address (env IDEM_REDIS_ADDR); streams are named peers:<run>")
	pgURL := fs.String("database", env("IDEM_PEERS_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idem_peers?sslmode=disable"), "PostgreSQL URL (env IDEM_PEERS_DATABASE_URL); its database is created when missing")
	only := fs.String("only", "", "comma-separated brokers or consumer keys to run (default: all)")
	repeat := fs.Int("repeat", 1, "rounds of every consumer; the table shows each one's best")
	out := fs.String("out", "", "write the figures as JSON to this file")
	fs.DurationVar(&opts.Settle, "settle", 2*time.Second, "pause between publishing a run's workload and starting its consumer")
	fs.DurationVar(&opts.Timeout, "timeout", 10*time.Minute, "longest a single run may take")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if opts.Dups < 0 {
		opts.Dups = opts.Messages / 100
	}
	if opts.Messages < 1 || opts.Batch < 1 || opts.Prefetch < opts.Batch || *repeat < 1 {
		return fmt.Errorf("want -messages >= 1, -batch >= 1, -prefetch >= -batch, -repeat >= 1")
	}
	if *kafka != "" {
		opts.Kafka = strings.Split(*kafka, ",")
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	defer stopNATS()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	bn, closeDB, err := open(ctx, *pgURL, opts)
	if err != nil {
		return err
	}
	defer closeDB()
	rep := Report{Started: time.Now().UTC(), Messages: opts.Messages, Dups: opts.Dups, Batch: opts.Batch, Prefetch: opts.Prefetch,
		Machine: machine(ctx, bn.Pool, opts)}
	w := NewWorkload(opts.Messages, opts.Dups)
	var failed []string
	// Rounds: each round runs every consumer once, so that a machine's
	// passing load falls on all of them alike.
	for i := range *repeat {
		for _, name := range brokerOrder {
			mk, ok := brokers[name]
			if !ok {
				continue
			}
			b := mk()
			for _, c := range b.Consumers {
				if !selected(*only, b.Name, c.Key) {
					continue
				}
				r := bn.Run(ctx, b, c, w, i+1)
				r.Absolute = b.Name != "kafka" || len(opts.Kafka) > 0
				fmt.Fprintf(os.Stderr, "%-9s %-18s %9.0f msgs/s  exactly once: %v %s\n", r.Broker, r.Key, r.Rate, r.OK, r.Error)
				if r.Error != "" {
					failed = append(failed, r.Broker+"/"+r.Key+": "+r.Error)
				}
				rep.Results = append(rep.Results, r)
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
	}
	report.Ratios(rep.Results)
	PrintTable(stdout, &rep)
	if *out != "" {
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*out, append(data, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "figures written to", *out)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d runs failed:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	return nil
}

func selected(only, broker, key string) bool {
	if only == "" {
		return true
	}
	sel := strings.Split(only, ",")
	hasBroker := slices.ContainsFunc(sel, func(s string) bool { _, ok := brokers[s]; return ok || s == "kafka" })
	if hasBroker && !slices.Contains(sel, broker) {
		return false
	}
	hasKey := slices.ContainsFunc(sel, func(s string) bool { _, ok := brokers[s]; return !ok && s != "kafka" })
	return !hasKey || slices.Contains(sel, key)
}

// open connects to PostgreSQL, creating the database when it is missing,
// and migrates the idem inbox.
func open(ctx context.Context, url string, opts Options) (*Bench, func(), error) {
	if err := createDatabase(ctx, url); err != nil {
		return nil, nil, fmt.Errorf("PostgreSQL at %s: %w (make services starts it)", url, err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	store, err := Inbox(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return &Bench{Pool: pool, Store: store, Opts: opts}, pool.Close, nil
}

// createDatabase creates url's database when it does not exist.
func createDatabase(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	name := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil || exists {
		return err
	}
	_, err = conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" {
		return nil // created meanwhile
	}
	return err
}

func machine(ctx context.Context, pool *pgxpool.Pool, opts Options) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, Kafka: "kfake (in-process)"}
	_ = pool.QueryRow(ctx, `SHOW server_version`).Scan(&m.Postgres)
	if len(opts.Kafka) > 0 {
		m.Kafka = strings.Join(opts.Kafka, ",")
	}
	m.RabbitMQ = rabbitVersion(opts.AMQPURL)
	m.NATS = natsVersion(opts.NATSURL)
	m.Redis = redisVersion(opts.RedisAddr)
	return m
}

// PrintTable writes the best run of each consumer as a Markdown table.
func PrintTable(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "\n%d messages + %d redeliveries, batch %d, prefetch %d; %d CPUs, %s, PostgreSQL %s, RabbitMQ %s, Kafka %s, NATS %s, Redis %s\n\n",
		rep.Messages, rep.Dups, rep.Batch, rep.Prefetch, rep.Machine.CPUs, rep.Machine.Go, rep.Machine.Postgres, rep.Machine.RabbitMQ, rep.Machine.Kafka,
		rep.Machine.NATS, rep.Machine.Redis)
	fmt.Fprintln(w, "| broker | consumer | msgs/s | × hand-rolled batch | exactly once |")
	fmt.Fprintln(w, "|---|---|---:|---:|---|")
	for _, r := range report.Best(rep.Results) {
		rate := fmt.Sprintf("%.0f", r.Rate)
		if !r.Absolute {
			rate = "(" + rate + ")"
		}
		once := "yes"
		switch {
		case r.Error != "" && r.Rate == 0:
			once = "failed: " + r.Error
		case !r.OK && !r.Guarded:
			once = fmt.Sprintf("no guard: %d doubled", r.Check.Doubled)
		case !r.OK:
			once = "NO: " + r.Error
		}
		ratio := "—"
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", r.Broker, r.Consumer, rate, ratio, once)
	}
	if slices.ContainsFunc(rep.Results, func(r Result) bool { return !r.Absolute }) {
		fmt.Fprintln(w, "\nKafka runs in process (kfake): its rates in brackets compare consumers with each other only; the ratio is the figure.")
	}
}
