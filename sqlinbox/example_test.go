package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// A message delivered twice invoices once: the second delivery finds the
// marker the first one committed with the invoice.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sqlinbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(filepath.Join(dir, "billing.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE invoices (customer TEXT, period TEXT)`); err != nil {
		log.Fatal(err)
	}

	store, err := sqlinbox.New(db, sqlinbox.SQLite, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "billing-invoice",
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO invoices VALUES ('c-1247', '2024-05')`)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	msg := idem.Message{ID: "evt-0001", Body: []byte(`{"customer":"c-1247","period":"2024-05"}`)}
	fmt.Println(proc.Process(ctx, msg).Outcome)
	fmt.Println(proc.Process(ctx, msg).Outcome) // the broker redelivered it
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM invoices`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoices:", n)
	// Output:
	// applied
	// duplicate
	// invoices: 1
}
