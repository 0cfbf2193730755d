package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// handOver is a Publisher that hands each record straight to the next
// consumer, twice, standing in for a broker that redelivers (a service
// uses kafkapub or amqppub, and the next consumer runs on idemkafka or
// idemrabbitmq). The message it builds is what those adapters hand the
// processor: the record's ID as the message ID, its event time.
type handOver struct {
	next *idem.Processor[*sql.Tx]
	done chan struct{}
}

func (h *handOver) Publish(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	for i, r := range recs {
		m := idem.Message{ID: r.ID, Key: r.Key, Body: r.Body, Time: r.EventTime, TimeSource: idem.TimeFromID}
		first, again := h.next.Process(ctx, m), h.next.Process(ctx, m)
		fmt.Printf("notifications: %s, then %s\n", first.Outcome, again.Outcome)
		if first.Err != nil {
			errs[i] = first.Err
		}
	}
	close(h.done)
	return errs
}

func (h *handOver) Close() error { return nil }

// The whole pipeline, exactly once in effect: the accounting consumer
// credits a merchant and emits BalanceChanged in the same transaction (the
// OrderPaid delivered twice moves the balance once and emits one event);
// the relay publishes the committed event; the notifications consumer,
// with its own inbox, sends one notification however often the event
// arrives.
func Example_pipeline() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outbox-pipeline")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(filepath.Join(dir, "pipeline.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE merchants (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
INSERT INTO merchants VALUES (1, 0);
CREATE TABLE notifications (event_id TEXT NOT NULL, body TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	store, err := sqliteinbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	events, err := outbox.NewSQL(db, sqliteinbox.Dialect, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := events.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)

	// Consumer A: the effect and the event it emits, one transaction.
	accounting, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "accounting",
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
			var balance int64
			if err := tx.QueryRowContext(ctx, `UPDATE merchants SET balance = balance + 12500 WHERE id = 1 RETURNING balance`).Scan(&balance); err != nil {
				return err
			}
			_, err := events.Enqueue(ctx, tx, outbox.Message{
				Destination: "merchant.balances",
				Key:         "merchant-1",
				Body:        fmt.Appendf(nil, `{"merchant_id":1,"balance":%d}`, balance),
			})
			return err
		},
		Logger: quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	// Consumer B: its own effect, guarded by its own inbox markers.
	notifications, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "notifications",
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO notifications VALUES ($1, $2)`, m.ID, string(m.Body))
			return err
		},
		Logger: quiet,
	})
	if err != nil {
		log.Fatal(err)
	}

	paid := idem.Message{ID: "order-paid-42", Body: []byte(`{"merchant_id":1,"amount":12500}`)}
	fmt.Printf("accounting: %s, then %s\n", accounting.Process(ctx, paid).Outcome, accounting.Process(ctx, paid).Outcome)

	pub := &handOver{next: notifications, done: make(chan struct{})}
	relay, err := outbox.NewRelay(events, pub, &outbox.RelayConfig{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error)
	go func() { ran <- relay.Run(runCtx) }()
	<-pub.done
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}

	var balance, sent int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM merchants WHERE id = 1`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM notifications`).Scan(&sent); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance", balance, "notifications", sent)
	// Output:
	// accounting: applied, then duplicate
	// notifications: applied, then duplicate
	// balance 12500 notifications 1
}
