package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
)

// TestEnqueueStaysInTheCallersTransaction: the first Enqueue of an Outbox
// value reads the shard count inside the caller's transaction. On a
// *pgx.Conn a read of its own (BEGIN … ROLLBACK on the same session) ended
// the caller's transaction, so a rolled-back effect's event was committed
// and published; on a pool whose only connection the caller holds, a read
// of its own waited forever.
func TestEnqueueStaysInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, _ := migratedOutbox(t)
	count := func() (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("conn", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		o, err := NewPgx(conn, nil) // a new value: the shard count is not read yet
		if err != nil {
			t.Fatal(err)
		}
		before := count()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o.Enqueue(ctx, tx, Message{Destination: "d", Key: "k", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if n := count(); n != before {
			t.Errorf("the caller rolled back, yet %d outbox row(s) were committed", n-before)
		}
	})

	t.Run("pool of one", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		one, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer one.Close()
		o, err := NewPgx(one, nil)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := one.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := o.Enqueue(cctx, tx, Message{Destination: "d", Key: "k", Body: []byte("x")}); err != nil {
			t.Errorf("Enqueue in the pool's only transaction: %v", err)
		}
	})
}

// TestKeyLockFollowsTheTableNotItsName: one table named two ways
// (idem_outbox, and schema-qualified) takes one lock per key, so two
// transactions on one key still commit in the order of their rows.
func TestKeyLockFollowsTheTableNotItsName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool, plain := migratedOutbox(t)
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	qualified, err := NewPgx(pool, &Config{Table: schema + ".idem_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(ctx) }()
	if _, err := plain.Enqueue(ctx, tx1, Message{Destination: "d", Key: "k", Body: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx2.Rollback(ctx) }()
	// The key is tx1's until it ends: tx2 must wait (here: until its
	// deadline), not take the key under the other name.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := qualified.Enqueue(cctx, tx2, Message{Destination: "d", Key: "k", Body: []byte("2")}); err == nil {
		t.Errorf("a second transaction enqueued key k under the table's other name while the first held k's lock")
	}
}

// migratedOutbox is a schema of its own with the outbox migrated: its URL,
// a pool on it, and the Outbox that migrated it.
func migratedOutbox(t *testing.T) (string, *pgxpool.Pool, *Outbox[pgx.Tx]) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	o, err := NewPgx(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return url, pool, o
}
