package pgxinbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// TestBeginTravelsWithTheClaim: a store's transaction sends no BEGIN of
// its own; the claim carries it, and the transaction is then a whole one:
// a rollback undoes the claim and a commit keeps it.
func TestBeginTravelsWithTheClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Plain, nil)
	for _, n := range []int{1, 3} {
		for _, commit := range []bool{false, true} {
			tx, err := store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if s := tx.Conn().PgConn().TxStatus(); s != 'T' {
				t.Fatalf("Conn of a transaction: status %q, want in a transaction", s)
			}
			_ = tx.Rollback(ctx)
			tx, err = store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			claims := make([]idemstore.Claim, n)
			for i := range claims {
				k := time.Now().Format(time.RFC3339Nano) + "-" + string(rune('a'+i))
				claims[i] = idemstore.Claim{Key: k, MessageID: k}
			}
			if _, err := store.Claim(ctx, tx, "ledger", claims, time.Second); err != nil {
				t.Fatal(err)
			}
			var inTx bool
			if err := tx.QueryRow(ctx, `SELECT txid_current_if_assigned() IS NOT NULL`).Scan(&inTx); err != nil || !inTx {
				t.Fatalf("after the claim: in a transaction with a txid %v (%v)", inTx, err)
			}
			if commit {
				err = store.Commit(ctx, tx)
			} else {
				err = store.Rollback(ctx, tx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("rollback after the end: %v, want ErrTxClosed", err)
			}
			var rows int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_inbox WHERE key = ANY($1)`, []string{claims[0].Key}).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 0, true: 1}[commit]; rows != want {
				t.Fatalf("%d claims, commit %v: %d markers, want %d", n, commit, rows, want)
			}
		}
	}
	if got := pool.Stat().AcquiredConns(); got != 0 {
		t.Fatalf("%d connections still acquired after every transaction ended", got)
	}
}

// TestTransactionWithoutClaim: a transaction whose first statement is not
// a claim (a natural consumer's handler) begins with it; savepoints, large
// objects and an unused transaction work as on pgx's own.
func TestTransactionWithoutClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, store := openLayout(t, pgxinbox.Plain, nil)
	insert := func(tx pgx.Tx, id string) {
		t.Helper()
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ('natural', $1, $1)`, id); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE consumer = 'natural'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert(tx, "rolled-back")
	if err := store.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d rows after a rollback, want 0: the first statement ran outside the transaction", n)
	}
	tx, err = store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert(tx, "kept")
	sp, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert(sp, "undone")
	if err := sp.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lo := tx.LargeObjects()
	oid, err := lo.Create(ctx, 0)
	if err != nil {
		t.Fatalf("large object in the transaction: %v", err)
	}
	if err := lo.Unlink(ctx, oid); err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d rows, want 1: the savepoint's insert was rolled back, the other kept", n)
	}
	// A transaction nothing ran in commits and rolls back without a word.
	for _, end := range []func(context.Context, pgx.Tx) error{store.Commit, store.Rollback} {
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := end(ctx, tx); err != nil {
			t.Fatalf("ending an unused transaction: %v", err)
		}
	}
	if got := pool.Stat().AcquiredConns(); got != 0 {
		t.Fatalf("%d connections still acquired after every transaction ended", got)
	}
}

// TestStoreOnOneConnection: on a single connection the store's
// transactions work too, one after another.
func TestStoreOnOneConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	store, err := pgxinbox.New(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ins, err := store.Claim(ctx, tx, "ledger", []idemstore.Claim{{Key: "k", MessageID: "m"}}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ins[0] != want {
			t.Fatalf("claim %d: inserted %v, want %v", i, ins[0], want)
		}
		if err := store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	if s := conn.PgConn().TxStatus(); s != 'I' {
		t.Fatalf("connection left in status %q", s)
	}
}
