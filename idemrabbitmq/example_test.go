package idemrabbitmq_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/pgxinbox"
)

// The processor decides what becomes of a message ([idem.Processor.Dispose]);
// the consumer only maps its action to broker verbs, in one table.
func ExampleVerbFor() {
	for _, a := range []idem.Action{idem.ActionAck, idem.ActionRedeliver, idem.ActionHold, idem.ActionDeadLetter} {
		fmt.Printf("%s → %s\n", a, idemrabbitmq.VerbFor(a))
	}
	// Output:
	// ack → ack
	// redeliver → requeue
	// hold → hold
	// dead_letter → dead_letter
}

// A billing consumer that creates one invoice per message, however often
// RabbitMQ delivers it.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1:5432/billing")
	if err != nil {
		log.Fatal(err)
	}
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// Creates or upgrades the inbox table; a team with a migration tool
	// applies `idem inbox ddl` instead, and the consumer checks the table
	// when it starts.
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "billing-invoice",
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO invoices (source_message_id, body) VALUES ($1, $2)`, m.ID, m.Body)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, "billing.invoice", nil)
	if err != nil {
		log.Fatal(err)
	}

	c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{
		URL:   "amqp://guest:guest@127.0.0.1:5672/",
		Queue: topo.Queue, // dead letters go to topo.DeadLetterQueue, billing.invoice.dlq
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until ctx is cancelled
		log.Fatal(err)
	}
}

// One idemprom.Metrics in the processor's hooks counts what the consumer
// sees too: here idem_redelivered_total, labelled by consumer, for the
// deliveries the broker flagged as redelivered.
func Example_metrics() {
	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	hooks := []idem.Hook{m}
	// proc, _ := idem.NewProcessor(store, &idem.Config[pgx.Tx]{..., Hooks: hooks})
	// c, _ := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{...})

	// What the consumer does for two redelivered deliveries:
	for range 2 {
		idem.Each(hooks, func(h idembroker.RedeliveredHook) { h.OnRedelivered("billing-invoice", "billing.invoice") })
	}

	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "idem_redelivered_total" {
			for _, s := range f.GetMetric() {
				fmt.Println(f.GetName(), s.GetLabel()[0].GetValue(), s.GetCounter().GetValue())
			}
		}
	}
	// Output:
	// idem_redelivered_total billing-invoice 2
}
