package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// The ledger told in docs/design.md: OrderPaid adds 12,500 to a merchant's balance. The
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

// openExampleSchema connects to the PostgreSQL of $IDEM_DATABASE_URL (else
// the local server) with every connection's search_path on a fresh schema,
// so that the inbox and the example's tables land there; drop removes
// the schema and closes the pool. A service connects with its own URL and
// needs none of this.
func openExampleSchema(ctx context.Context, schema string) (pool *pgxpool.Pool, drop func()) {
	url := os.Getenv("IDEM_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	name := pgx.Identifier{schema}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE; CREATE SCHEMA "+name); err != nil {
		log.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		log.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		if admin, err := pgx.Connect(ctx, url); err == nil {
			_, _ = admin.Exec(ctx, "DROP SCHEMA "+name+" CASCADE")
			admin.Close(ctx)
		}
	}
}

// The inbox in PostgreSQL with pgx: Migrate creates the inbox table once,
// and the handler's writes share the transaction of the message's claim.
// The redelivered copy is a Duplicate and the balance moves once.
func Example_postgres() {
	ctx := context.Background()
	pool, drop := openExampleSchema(ctx, "idem_example_postgres")
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE merchants (id bigint PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO merchants VALUES (1, 0)`); err != nil {
		log.Fatal(err)
	}

	store, err := pgxinbox.New(pool, nil) // the table idem_inbox
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // at start-up, or `idem inbox migrate`
		log.Fatal(err)
	}
	type orderPaid struct {
		MerchantID int64 `json:"merchant_id"`
		Amount     int64 `json:"amount"`
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "accounting",
		Key:      idem.ByMessageID,
		Handler: idem.JSON(func(ctx context.Context, tx pgx.Tx, m idem.Message, e orderPaid) error {
			_, err := tx.Exec(ctx, `UPDATE merchants SET balance = balance + $1 WHERE id = $2`, e.Amount, e.MerchantID)
			return err
		}),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}

	msg := idem.Message{ID: "event-42", Body: []byte(`{"merchant_id":1,"amount":12500}`)}
	first := proc.Process(ctx, msg)
	again := proc.Process(ctx, msg) // redelivered after a lost ack
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM merchants WHERE id = 1`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Outcome, again.Outcome, balance)
	// Output: applied duplicate 12500
}

// ProcessTx runs the claim and the handler in a transaction the caller
// owns, next to the caller's own writes (here a request log): one commit
// keeps them all, one rollback none. The caller commits on Applied and on
// Duplicate, and rolls back on an error.
func ExampleProcessor_ProcessTx() {
	ctx := context.Background()
	pool, drop := openExampleSchema(ctx, "idem_example_processtx")
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE points (customer text PRIMARY KEY, points bigint NOT NULL);
CREATE TABLE requests (id bigserial PRIMARY KEY, message_id text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "loyalty",
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO points VALUES ($1, 10)
ON CONFLICT (customer) DO UPDATE SET points = points.points + 10`, string(m.Body))
			return err
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}

	handle := func(msg idem.Message) idem.Outcome {
		tx, err := pool.Begin(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer tx.Rollback(ctx) // a no-op after Commit
		if _, err := tx.Exec(ctx, `INSERT INTO requests (message_id) VALUES ($1)`, msg.ID); err != nil {
			log.Fatal(err)
		}
		r, err := proc.ProcessTx(ctx, tx, msg)
		if err != nil {
			log.Fatal(err) // roll back (deferred) and let the message be retried
		}
		if r.Outcome.Acked() { // Applied or Duplicate: commit
			if err := store.Commit(ctx, tx); err != nil {
				log.Fatal(err)
			}
		}
		return r.Outcome
	}
	msg := idem.Message{ID: "visit-7", Body: []byte("cust-1")}
	fmt.Println(handle(msg), handle(msg))
	var points, requests int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT points FROM points WHERE customer = 'cust-1'), (SELECT count(*) FROM requests)`).Scan(&points, &requests); err != nil {
		log.Fatal(err)
	}
	fmt.Println("points:", points, "requests logged:", requests)
	// Output:
	// applied duplicate
	// points: 10 requests logged: 2
}

// A permanent error is one no retry can fix: the message is dead-lettered
// at once, with the reason in Result.Err, and nothing it wrote is kept.
// Any other error is retried first.
func ExamplePermanent() {
	ctx := context.Background()
	pool, drop := openExampleSchema(ctx, "idem_example_permanent")
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE refunds (order_id text PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	type refund struct {
		OrderID  string `json:"order_id"`
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	errCurrency := errors.New("currency not supported")
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "refunds",
		Key:      idem.ByMessageID,
		Handler: idem.JSON(func(ctx context.Context, tx pgx.Tx, m idem.Message, r refund) error {
			if _, err := tx.Exec(ctx, `INSERT INTO refunds VALUES ($1, $2, $3)`, r.OrderID, r.Amount, r.Currency); err != nil {
				return err // transient until proven otherwise: retried
			}
			if r.Currency != "VND" {
				return idem.Permanent(fmt.Errorf("refund of order %s: %w: %q", r.OrderID, errCurrency, r.Currency))
			}
			return nil
		}),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}

	r := proc.Process(ctx, idem.Message{ID: "refund-9", Body: []byte(`{"order_id":"o-9","amount":500,"currency":"XYZ"}`)})
	fmt.Println(r.Outcome, r.Attempts, errors.Is(r.Err, errCurrency))
	fmt.Println(r.Err)
	var kept int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM refunds`).Scan(&kept); err != nil {
		log.Fatal(err)
	}
	fmt.Println("refunds kept:", kept)
	// Output:
	// dead_lettered 1 true
	// handling message refund-9: permanent: refund of order o-9: currency not supported: "XYZ"
	// refunds kept: 0
}

// HandleBatch writes every fresh message of a transaction with one
// pipelined batch, and JSONBatch decodes their bodies first. A key
// already applied (the redelivered ord-1) is not passed to the handler.
func ExampleJSONBatch() {
	ctx := context.Background()
	pool, drop := openExampleSchema(ctx, "idem_example_jsonbatch")
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE stock (product text PRIMARY KEY, quantity bigint NOT NULL);
INSERT INTO stock VALUES ('apple', 100), ('pear', 100)`); err != nil {
		log.Fatal(err)
	}
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	type orderPlaced struct {
		Product  string `json:"product"`
		Quantity int64  `json:"quantity"`
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "inventory",
		Key:      idem.ByMessageID,
		HandleBatch: idem.JSONBatch(func(ctx context.Context, tx pgx.Tx, msgs []idem.Message, orders []orderPlaced) error {
			b := &pgx.Batch{}
			for _, o := range orders {
				b.Queue(`UPDATE stock SET quantity = quantity - $1 WHERE product = $2`, o.Quantity, o.Product)
			}
			return tx.SendBatch(ctx, b).Close()
		}),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}

	proc.Process(ctx, idem.Message{ID: "ord-1", Body: []byte(`{"product":"apple","quantity":3}`)})
	results := proc.ProcessBatch(ctx, []idem.Message{
		{ID: "ord-1", Body: []byte(`{"product":"apple","quantity":3}`)}, // redelivered
		{ID: "ord-2", Body: []byte(`{"product":"pear","quantity":5}`)},
		{ID: "ord-3", Body: []byte(`{"product":"apple","quantity":1}`)},
	})
	for _, r := range results {
		fmt.Println(r.MessageID, r.Outcome)
	}
	rows, err := pool.Query(ctx, `SELECT product, quantity FROM stock ORDER BY product`)
	if err != nil {
		log.Fatal(err)
	}
	stock, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Product  string
		Quantity int64
	}])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(stock)
	// Output:
	// ord-1 duplicate
	// ord-2 applied
	// ord-3 applied
	// [{apple 96} {pear 95}]
}
