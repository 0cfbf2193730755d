package idemnats_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/pgxinbox"
)

// The processor decides what becomes of a message ([idem.Processor.Dispose]);
// the consumer only maps its action to JetStream verbs, in one table.
func ExampleVerbFor() {
	for _, a := range []idem.Action{idem.ActionAck, idem.ActionRedeliver, idem.ActionHold, idem.ActionDeadLetter} {
		fmt.Printf("%s → %s\n", a, idemnats.VerbFor(a))
	}
	// Output:
	// ack → ack
	// redeliver → nak
	// hold → hold
	// dead_letter → dead_letter
}

// A billing consumer that creates one invoice per message, however often
// JetStream delivers it.
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
	c, err := idemnats.NewConsumer(proc, &idemnats.Config{
		URL:    "nats://127.0.0.1:4222",
		Stream: "BILLING", // the durable billing-invoice is created when missing
		// Dead letters go to BILLING_DLQ, on subject idem.dlq.BILLING.
		CreateDeadLetterStream: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until ctx is cancelled
		log.Fatal(err)
	}
}
