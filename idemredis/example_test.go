package idemredis_test

import (
	"context"
	"fmt"
	"log"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/pgxinbox"
)

// The processor decides what becomes of an entry; the consumer only maps
// its action to Redis verbs, in one table.
func ExampleVerbFor() {
	for _, a := range []idem.Action{idem.ActionAck, idem.ActionRedeliver, idem.ActionHold, idem.ActionDeadLetter} {
		fmt.Printf("%s → %s\n", a, idemredis.VerbFor(a))
	}
	// Output:
	// ack → ack
	// redeliver → leave
	// hold → leave
	// dead_letter → dead_letter
}

// A first consumer: one invoice per message of the stream "billing",
// however often Redis delivers it.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1:5432/billing")
	if err != nil {
		log.Fatal(err)
	}
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // or apply `idem inbox ddl`
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
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	c, err := idemredis.New(rdb, proc, &idemredis.Config{
		Stream:                 "billing",
		Group:                  "invoice",
		GroupStart:             "0",  // create the group (and stream) when missing
		CreateDeadLetterStream: true, // billing.dlq
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until SIGTERM
		log.Fatal(err)
	}
}
