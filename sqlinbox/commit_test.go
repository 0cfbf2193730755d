package sqlinbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// TestCommitUnknownPostgres kills the transaction's backend from another
// connection right before COMMIT: the client cannot know whether the commit
// happened, so the error must wrap idem.ErrCommitUnknown (outcome Retry, never
// Applied).
func TestCommitUnknownPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openPostgres(t)
	s := migrated(t, db, postgresDialect(), nil)
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Rollback(ctx, tx) }()
	if _, err := s.Claim(ctx, tx, "billing", []idemstore.Claim{{Key: "k1", MessageID: "m1", BodySHA256: idem.BodyHash(nil)}}, time.Second); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var killed bool
	if err := db.QueryRowContext(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminating backend %d: %v %v", pid, killed, err)
	}
	err = s.Commit(ctx, tx)
	var pgErr *pgconn.PgError
	t.Logf("commit error: %v (PgError: %v)", err, errors.As(err, &pgErr))
	if !errors.Is(err, idem.ErrCommitUnknown) {
		t.Fatalf("commit on a terminated backend: %v, want it to wrap idem.ErrCommitUnknown", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM idem_inbox").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d markers after a terminated transaction; the server should have rolled it back", n)
	}
}

// TestCommitRefusedIsKnown: when the server answers COMMIT with an ERROR (a
// deferred constraint failed), the transaction is rolled back and the
// outcome is known, so the error must not claim otherwise.
func TestCommitRefusedIsKnown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openPostgres(t)
	s := migrated(t, db, postgresDialect(), nil)
	if _, err := db.ExecContext(ctx, `CREATE TABLE invoices (customer text, period text,
		UNIQUE (customer, period) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Rollback(ctx, tx) }()
	for range 2 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO invoices VALUES ('c-1', '2024-05')`); err != nil {
			t.Fatal(err)
		}
	}
	err = s.Commit(ctx, tx)
	if err == nil || errors.Is(err, idem.ErrCommitUnknown) {
		t.Fatalf("commit of a deferred unique violation: %v, want a known failure", err)
	}
	if c := s.Classify(err); c != idemstore.ClassPermanent {
		t.Fatalf("deferred unique violation classified %v, want permanent", c)
	}
}

// TestBeginSurvivesCancel pins why Begin detaches from ctx: database/sql
// would otherwise roll the transaction back as soon as the context ends, and
// the processor's commit during shutdown would fail.
func TestBeginSurvivesCancel(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := migrated(t, db, b.dialect, nil)
			ctx, cancel := context.WithCancel(context.Background())
			tx, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ins, err := s.Claim(ctx, tx, "billing", []idemstore.Claim{{Key: "k", MessageID: "m", BodySHA256: idem.BodyHash(nil)}}, time.Second)
			if err != nil || !ins[0] {
				t.Fatalf("claim: %v %v", ins, err)
			}
			cancel()
			if err := s.Commit(context.Background(), tx); err != nil {
				t.Fatalf("commit after the begin context ended: %v", err)
			}
			if n := countRows(t, db, "idem_inbox"); n != 1 {
				t.Fatalf("%d markers after commit, want 1", n)
			}
		})
	}
}
