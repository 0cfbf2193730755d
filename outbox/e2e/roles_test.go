package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/pgxinbox"

	"github.com/idemkit/idem/internal/amqptest"
)

// The test binary runs again as one part of the pipeline when roleEnv is
// set: "relay", "a" (consumer A) or "b" (consumer B). The parent test kills
// it with SIGKILL and starts it again.
const (
	roleEnv      = "IDEM_E2E_ROLE"
	dbEnv        = "IDEM_E2E_DB"
	queueAEnv    = "IDEM_E2E_QUEUE_A"
	queueBEnv    = "IDEM_E2E_QUEUE_B"
	dieAfterEnv  = "IDEM_E2E_DIE_AFTER"  // relay: SIGKILL itself after this many confirmed Publish calls, before marking
	diedFileEnv  = "IDEM_E2E_DIED_FILE"  // relay: where it writes the IDs of the batch it dies with
	amqpURLEnv   = "IDEM_AMQP_URL"       // as in the other packages' tests
	leaseTermEnv = "IDEM_E2E_LEASE_TERM" // relay: its lease term
	kafkaEnv     = "IDEM_E2E_KAFKA"      // the Kafka brokers: the events go to topicEnv, B consumes it there
	topicEnv     = "IDEM_E2E_TOPIC"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		if err := runRole(role); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// amqpURL is the test broker: see [amqptest.URL].
func amqpURL() string { return amqptest.URL() }

// rejected says which input messages consumer A's handler fails with a
// permanent error after it applied its effect and enqueued its event: the
// transaction rolls back, so neither may be seen.
func rejected(n int) bool { return n%10 == 3 }

// runRole runs one part of the pipeline until SIGTERM (or SIGKILL).
func runRole(role string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	pool, err := pgxpool.New(ctx, os.Getenv(dbEnv))
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.NewPgx(pool, nil)
	if err != nil {
		return err
	}
	switch role {
	case "relay":
		return runRelay(ctx, ob, log)
	case "a", "b":
		return runConsumer(ctx, role, pool, ob, log)
	}
	return fmt.Errorf("unknown role %q", role)
}

func runRelay(ctx context.Context, ob *outbox.Outbox[pgx.Tx], log *slog.Logger) error {
	if brokers := os.Getenv(kafkaEnv); brokers != "" {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}, kafkapub.ProducerOptions()...)...)
		if err != nil {
			return err
		}
		defer cl.Close()
		kp, err := kafkapub.New(cl, nil)
		if err != nil {
			return err
		}
		return relayWith(ctx, ob, kp, log)
	}
	dialer := func(context.Context) (*amqp.Connection, error) { return amqp.Dial(amqpURL()) }
	conn, err := dialer(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	ap, err := amqppub.New(conn, &amqppub.Config{Redial: dialer})
	if err != nil {
		return err
	}
	return relayWith(ctx, ob, ap, log)
}

func relayWith(ctx context.Context, ob *outbox.Outbox[pgx.Tx], pub outbox.Publisher, log *slog.Logger) error {
	if n, _ := strconv.Atoi(os.Getenv(dieAfterEnv)); n > 0 {
		pub = &dying{Publisher: pub, after: n, file: os.Getenv(diedFileEnv)}
	}
	term := 3 * time.Second
	if d, err := time.ParseDuration(os.Getenv(leaseTermEnv)); err == nil {
		term = d
	}
	relay, err := outbox.NewRelay(ob, pub, &outbox.RelayConfig{LeaseTerm: term, PollInterval: 200 * time.Millisecond, Logger: log})
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

// dying is a publisher that kills its process once a call was confirmed,
// before the relay can mark the rows: the crash between publish and mark.
type dying struct {
	outbox.Publisher
	after, calls int
	file         string
}

func (d *dying) Publish(ctx context.Context, recs []outbox.Record) []error {
	errs := d.Publisher.Publish(ctx, recs)
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	if d.calls++; d.calls < d.after {
		return errs
	}
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	_ = os.WriteFile(d.file, []byte(strings.Join(ids, "\n")), 0o600)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

func runConsumer(ctx context.Context, role string, pool *pgxpool.Pool, ob *outbox.Outbox[pgx.Tx], log *slog.Logger) error {
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		return err
	}
	queueB := os.Getenv(queueBEnv)
	var h idem.Handler[pgx.Tx]
	queue := queueB
	if role == "a" {
		queue = os.Getenv(queueAEnv)
		h = func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			n, err := strconv.Atoi(string(m.Body))
			if err != nil {
				return idem.Permanent(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO a_effects (message_id, n) VALUES ($1, $2)`, m.ID, n); err != nil {
				return err
			}
			ev := outbox.Message{DefaultExchange: true, RoutingKey: queueB, Key: "k" + strconv.Itoa(n%50), Body: m.Body,
				Headers: map[string]string{"x-cause": m.ID}}
			if topic := os.Getenv(topicEnv); topic != "" {
				ev.DefaultExchange, ev.RoutingKey, ev.Destination = false, "", topic
			}
			if _, err := ob.Enqueue(ctx, tx, ev); err != nil {
				return err
			}
			if rejected(n) {
				return idem.Permanent(errors.New("rejected after the effect and the event were written"))
			}
			return nil
		}
	} else {
		h = func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			n, err := strconv.Atoi(string(m.Body))
			if err != nil {
				return idem.Permanent(err)
			}
			_, err = tx.Exec(ctx, `INSERT INTO b_effects (message_id, n, cause) VALUES ($1, $2, $3)`, m.ID, n, m.Headers["x-cause"])
			return err
		}
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{Consumer: "consumer-" + role, Key: idem.ByMessageID, Handler: h, Logger: log})
	if err != nil {
		return err
	}
	if brokers := os.Getenv(kafkaEnv); brokers != "" && role == "b" {
		topic := os.Getenv(topicEnv)
		opts := append(idemkafka.GroupOptions("consumer-b", topic), kgo.SeedBrokers(strings.Split(brokers, ",")...),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		cl, err := kgo.NewClient(append(opts, kafkatest.GroupOptions()...)...)
		if err != nil {
			return err
		}
		defer cl.Close()
		cons, err := idemkafka.NewConsumer(cl, proc, &idemkafka.Config{Logger: log})
		if err != nil {
			return err
		}
		return cons.Run(ctx)
	}
	cons, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: amqpURL(), Queue: queue, Logger: log, ShutdownGrace: time.Second})
	if err != nil {
		return err
	}
	return cons.Run(ctx)
}
