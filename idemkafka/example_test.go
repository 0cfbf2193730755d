package idemkafka_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/url"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A producer publishes the same invoice event twice; the consumer applies it
// once and counts the duplicate. kfake stands in for a Kafka cluster.
func Example() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "invoices", "invoices.dlq"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	pool, drop := examplePool(ctx) // PostgreSQL, in a schema of its own
	defer drop()

	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (event_id text, body text)`); err != nil {
		log.Fatal(err)
	}
	counts := newOutcomes()
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "billing-invoice",
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO invoices VALUES ($1, $2)`, m.ID, m.Body)
			return err
		},
		Hooks:  []idem.Hook{counts},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}

	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	for _, id := range []string{"inv-1", "inv-2", "inv-1"} { // inv-1 is published twice
		if err := idemkafka.Publish(ctx, producer, "invoices", id, nil, []byte("invoice "+id)); err != nil {
			log.Fatal(err)
		}
	}

	c, err := idemkafka.New(idemkafka.ClientConfig{
		Brokers: cluster.ListenAddrs(),
		Group:   "billing",
		Topics:  []string{"invoices"},
	}, proc, nil)
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-counts.reached(idem.Duplicate, 1):
	case <-time.After(30 * time.Second):
		log.Fatal("timed out")
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("invoices: %d, applied: %d, duplicates: %d\n", rows, counts.get(idem.Applied), counts.get(idem.Duplicate))
	// Output: invoices: 2, applied: 2, duplicates: 1
}

// examplePool opens a pool on a fresh schema of the test database and
// returns it with a function that closes it and drops the schema.
func examplePool(ctx context.Context) (*pgxpool.Pool, func()) {
	base := pgtest.BaseURL()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		log.Fatalf("PostgreSQL at %s: %v; %s", base, err, pgtest.FixHint)
	}
	defer conn.Close(ctx)
	schema := fmt.Sprintf("example_kafka_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		if c, err := pgx.Connect(ctx, base); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			_ = c.Close(ctx)
		}
	}
}
