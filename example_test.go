package idem_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// The seeds' ledger: OrderPaid adds 12,500 to a merchant's balance. The
// broker delivers the event twice; the balance moves once.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
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
	store, err := sqlinbox.New(db, sqlinbox.SQLite, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	type orderPaid struct {
		MerchantID int64 `json:"merchant_id"`
		Amount     int64 `json:"amount"`
	}
	proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "accounting",
		Key:      idem.ByMessageID,
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, m idem.Message, e orderPaid) error {
			_, err := tx.ExecContext(ctx, `UPDATE merchants SET balance = balance + ? WHERE id = ?`, e.Amount, e.MerchantID)
			return err
		}),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}

	msg := idem.Message{ID: "event-42", Body: []byte(`{"merchant_id":1,"amount":12500}`)}
	first := proc.Process(ctx, msg)
	again := proc.Process(ctx, msg) // the process died before the ack: redelivered
	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM merchants WHERE id = 1`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Outcome, again.Outcome, balance)
	// Output: applied duplicate 12500
}
