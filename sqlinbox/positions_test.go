package sqlinbox_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/sqlinbox"
)

// Positions are upserted in the caller's transaction, only committed ones
// are read back, by source, and forgetting deletes one consumer's alone.
func testPositions(t *testing.T, s *sqlinbox.Store) {
	t.Helper()
	ctx := context.Background()
	record := func(consumer string, commit bool, ps ...idemstore.Position) {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RecordPositions(ctx, tx, consumer, ps); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = s.Commit(ctx, tx)
		} else {
			err = s.Rollback(ctx, tx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	record("a", true, idemstore.Position{Source: "t/1", Next: 10}, idemstore.Position{Source: "t/0", Next: 5})
	record("a", true, idemstore.Position{Source: "t/0", Next: 7})
	record("a", false, idemstore.Position{Source: "t/0", Next: 99})
	record("b", true, idemstore.Position{Source: "t/0", Next: 3})
	ps, err := s.Positions(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Source != "t/0" || ps[0].Next != 7 || ps[1].Source != "t/1" || ps[1].Next != 10 || ps[0].Updated.IsZero() {
		t.Fatalf("positions of a: %+v, want t/0 at 7 and t/1 at 10 with their times", ps)
	}
	if n, err := s.ForgetPositions(ctx, "a"); err != nil || n != 2 {
		t.Fatalf("ForgetPositions = %d, %v; want 2", n, err)
	}
	if ps, err := s.Positions(ctx, "a"); err != nil || len(ps) != 0 {
		t.Fatalf("positions of a after forgetting: %+v, %v", ps, err)
	}
	if ps, err := s.Positions(ctx, "b"); err != nil || len(ps) != 1 || ps[0].Next != 3 {
		t.Fatalf("positions of b after forgetting a's: %+v, %v", ps, err)
	}
}

func TestPositions(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testPositions(t, migrated(t, b.open(t), b.dialect, nil))
		})
	}
}
