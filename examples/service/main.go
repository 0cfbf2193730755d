// Command service is a production consumer to copy: it credits accounts
// from a RabbitMQ queue or a Kafka topic exactly once in effect, with the
// inbox in PostgreSQL, and serves /metrics, /healthz and /readyz.
//
//	go run ./examples/service --broker rabbitmq
//	go run ./examples/service --broker kafka --kafka-fake --publish 10
//
// The addresses and names can also come from the environment
// (IDEM_POSTGRES_URL, IDEM_AMQP_URL, IDEM_KAFKA_BROKERS, …); see -help.
// SIGINT or SIGTERM stops it gracefully: the batches in flight commit and
// are acked, then it exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/pgxinbox"
)

// Credit is the message body: {"account":"acct-1","amount_cents":500}.
type Credit struct {
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
}

// The effect: a ledger line and a running balance, written in the inbox's
// transaction. A credit applied twice would show in both.
const schema = `
CREATE TABLE IF NOT EXISTS ledger_entries (message_id text NOT NULL, account text NOT NULL, amount_cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS balances (account text PRIMARY KEY, balance_cents bigint NOT NULL);`

func credit(ctx context.Context, tx pgx.Tx, m idem.Message, c Credit) error {
	if c.Account == "" {
		return idem.Permanent(errors.New("credit without account")) // dead-lettered, not retried
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ledger_entries VALUES ($1, $2, $3)`, m.ID, c.Account, c.AmountCents); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET balance_cents = balances.balance_cents + EXCLUDED.balance_cents`, c.Account, c.AmountCents)
	return err
}

// consumer is what both adapters' consumers have in common.
type consumer interface {
	Run(ctx context.Context) error
	Health() idembroker.Health
}

var (
	broker   = flag.String("broker", env("IDEM_BROKER", "rabbitmq"), "rabbitmq or kafka ($IDEM_BROKER)")
	pgURL    = flag.String("postgres", env("IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"), "PostgreSQL URL of the inbox and the ledger ($IDEM_POSTGRES_URL)")
	amqpURL  = flag.String("amqp", env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL ($IDEM_AMQP_URL)")
	brokers  = flag.String("kafka-brokers", env("IDEM_KAFKA_BROKERS", ""), "Kafka seed brokers, host:port,… ($IDEM_KAFKA_BROKERS)")
	fake     = flag.Bool("kafka-fake", false, "start an in-process Kafka (kfake) instead of dialing -kafka-brokers")
	source   = flag.String("source", env("IDEM_SOURCE", "ledger.credits"), "queue or topic to consume (dead letters go to <source>.dlq) ($IDEM_SOURCE)")
	name     = flag.String("consumer", env("IDEM_CONSUMER", "ledger"), "consumer name: the inbox's key space and the Kafka group ($IDEM_CONSUMER)")
	listen   = flag.String("listen", env("IDEM_LISTEN", "127.0.0.1:9464"), "address of /metrics, /healthz and /readyz ($IDEM_LISTEN)")
	holdWait = flag.Duration("hold-after", 15*time.Second, "how long a batch waits for an unreachable database before its messages are held and /readyz says so")
	publish  = flag.Int("publish", 0, "publish this many demo credits at start, the first one twice")
)

func main() {
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		log.Error("service failed", "error", err)
		os.Exit(1)
	}
	log.Info("service stopped")
}

func run(ctx context.Context, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, *pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := idemprom.New(reg)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Hooks: []idem.Hook{metrics}})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil { // the inbox table and its stored window
		return err
	}
	reg.MustRegister(idemprom.NewInboxCollector(store, "", nil)) // oldest marker and window headroom by consumer
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("creating the ledger: %w", err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: *name,
		Key:      idem.ByMessageID,
		Handler:  idem.JSON(credit),
		Hooks:    []idem.Hook{metrics},
		Logger:   log,
		Retry:    idem.RetryPolicy{WaitUnavailable: *holdWait},
	})
	if err != nil {
		return err
	}
	if *broker == "kafka" && *fake {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, *source, *source+".dlq"))
		if err != nil {
			return err
		}
		defer cluster.Close() // after the consumer's last commit
		*brokers = strings.Join(cluster.ListenAddrs(), ",")
		log.Info("in-process Kafka", "brokers", *brokers)
	}
	var c consumer
	switch *broker {
	case "rabbitmq":
		c, err = rabbitmq(ctx, proc, log)
	case "kafka":
		c, err = kafka(ctx, proc, log)
	default:
		err = fmt.Errorf("-broker %q: want rabbitmq or kafka", *broker)
	}
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	idembroker.HandleHealth(mux, c) // /healthz and /readyz
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "broker", *broker, "source", *source)

	err = c.Run(ctx) // until SIGINT/SIGTERM; then drains what is in flight
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return err
}

func rabbitmq(ctx context.Context, proc *idem.Processor[pgx.Tx], log *slog.Logger) (consumer, error) {
	conn, err := amqp.Dial(*amqpURL)
	if err != nil {
		// Never log a password: the URL and the driver's error, which may
		// quote it, are redacted.
		return nil, fmt.Errorf("connecting to RabbitMQ at %s: %w", idembroker.RedactURL(*amqpURL), idembroker.RedactError(err, *amqpURL))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, *source, nil)
	if err != nil {
		return nil, err
	}
	if *publish > 0 {
		p, err := idemrabbitmq.NewPublisher(conn)
		if err != nil {
			return nil, err
		}
		var msgs []amqp.Publishing
		for id, body := range demo(*publish) {
			msgs = append(msgs, amqp.Publishing{MessageId: id, ContentType: "application/json", Body: body})
		}
		if err := p.Publish(ctx, "", topo.Queue, msgs...); err != nil {
			return nil, err
		}
	}
	return idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: *amqpURL, Queue: topo.Queue, Logger: log})
}

func kafka(ctx context.Context, proc *idem.Processor[pgx.Tx], log *slog.Logger) (consumer, error) {
	if *brokers == "" {
		return nil, errors.New("-broker kafka needs the brokers: set IDEM_KAFKA_BROKERS or -kafka-brokers, or pass -kafka-fake")
	}
	seeds := strings.Split(*brokers, ",")
	if *publish > 0 {
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.AllowAutoTopicCreation())
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		for id, body := range demo(*publish) {
			if err := idemkafka.Publish(ctx, cl, *source, id, nil, body); err != nil {
				return nil, err
			}
		}
	}
	return idemkafka.New(idemkafka.ClientConfig{Brokers: seeds, Group: *name, Topics: []string{*source}},
		proc, &idemkafka.Config{Logger: log, CreateDeadLetterTopics: true})
}

// demo yields n credits of 1.00 to acct-1…acct-3 with fresh IDs, and the
// first one again under its own ID: a redelivery, applied once.
func demo(n int) func(yield func(string, []byte) bool) {
	return func(yield func(string, []byte) bool) {
		first := ""
		for i := range n {
			id := idem.NewUUIDv7(time.Now())
			if i == 0 {
				first = id
			}
			if !yield(id, fmt.Appendf(nil, `{"account":"acct-%d","amount_cents":100}`, i%3+1)) {
				return
			}
		}
		yield(first, []byte(`{"account":"acct-1","amount_cents":100}`))
	}
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
