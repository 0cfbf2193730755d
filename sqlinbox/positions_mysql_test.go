package sqlinbox

import (
	"context"
	"testing"

	"github.com/idemkit/idem/idemstore"
)

// MySQL upserts positions in the caller's transaction, reads them back by
// source and forgets one consumer's alone.
func TestMySQLPositions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := New(mysqlDB(t), MySQL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		consumer string
		ps       []idemstore.Position
	}{
		{"a", []idemstore.Position{{Source: "t/1", Next: 10}, {Source: "t/0", Next: 5}}},
		{"a", []idemstore.Position{{Source: "t/0", Next: 7}}},
		{"b", []idemstore.Position{{Source: "t/0", Next: 3}}},
	} {
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RecordPositions(ctx, tx, r.consumer, r.ps); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
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
	if ps, err := s.Positions(ctx, "b"); err != nil || len(ps) != 1 || ps[0].Next != 3 {
		t.Fatalf("positions of b after forgetting a's: %+v, %v", ps, err)
	}
}
