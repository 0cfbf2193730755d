package idemrabbitmq_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/pgxinbox"
)

// Outcomes map to broker verbs in one place.
func ExampleVerbFor() {
	for _, o := range []idem.Outcome{idem.Applied, idem.Duplicate, idem.Retry, idem.DeadLettered, idem.Expired} {
		fmt.Printf("%s → %s\n", o, idemrabbitmq.VerbFor(o))
	}
	// Output:
	// applied → ack
	// duplicate → ack
	// retry → requeue
	// dead_lettered → dead_letter
	// expired → dead_letter
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
		URL:                "amqp://guest:guest@127.0.0.1:5672/",
		Queue:              topo.Queue,
		DeadLetterExchange: topo.DeadLetterExchange,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until ctx is cancelled
		log.Fatal(err)
	}
}
