package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// printer is a Publisher that prints what it is handed; a service uses the
// Kafka or RabbitMQ publisher.
type printer struct {
	mu   sync.Mutex
	done chan struct{}
}

func (p *printer) Publish(ctx context.Context, recs []outbox.Record) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range recs {
		fmt.Printf("published to %s, key %s: %s\n", r.Destination, r.Key, r.Body)
	}
	close(p.done)
	return make([]error, len(recs))
}

func (p *printer) Close() error { return nil }

// An idem handler applies its effect and enqueues the event it emits in the
// same transaction: the OrderPaid redelivered after a crash moves the
// balance once and emits one BalanceChanged; the relay publishes it after
// the commit, with an ID the next consumer deduplicates.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE merchants (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
INSERT INTO merchants VALUES (1, 0)`); err != nil {
		log.Fatal(err)
	}
	store, err := sqliteinbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	events, err := outbox.NewSQL(db, sqlinbox.SQLite, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := events.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "accounting",
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
			var balance int64
			if err := tx.QueryRowContext(ctx, `UPDATE merchants SET balance = balance + 12500 WHERE id = 1 RETURNING balance`).Scan(&balance); err != nil {
				return err
			}
			_, err := events.Enqueue(ctx, tx, outbox.Message{
				Destination: "ledger.balances",
				Key:         "merchant-1",
				Body:        fmt.Appendf(nil, `{"merchant_id":1,"balance":%d}`, balance),
			})
			return err
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	msg := idem.Message{ID: "event-42", Body: []byte(`{"merchant_id":1,"amount":12500}`)}
	fmt.Println(proc.Process(ctx, msg).Outcome, proc.Process(ctx, msg).Outcome)

	pub := &printer{done: make(chan struct{})}
	relay, err := outbox.NewRelay(events, pub, &outbox.RelayConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(ctx)
	ran := make(chan error)
	go func() { ran <- relay.Run(ctx) }()
	<-pub.done
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	st, err := events.Stats(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("unsent", st.Unsent, "sent", st.Sent)
	// Output:
	// applied duplicate
	// published to ledger.balances, key merchant-1: {"merchant_id":1,"balance":12500}
	// unsent 0 sent 1
}
