package idemstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/nopstore"
)

func TestMigrateReportSaysWhatHappened(t *testing.T) {
	cases := []struct {
		r    idemstore.MigrateReport
		want string
	}{
		{idemstore.MigrateReport{Table: "idem_inbox", Window: 14 * 24 * time.Hour, Created: true, To: 2},
			"created idem_inbox (plain layout, window 14d, schema version 2)"},
		{idemstore.MigrateReport{Table: "inbox", Layout: idemstore.LayoutPartitioned, Window: 36 * time.Hour, Created: true, To: 2, Partitions: 4},
			"created inbox (partitioned layout, window 36h0m0s, schema version 2); created 4 daily partitions"},
		{idemstore.MigrateReport{Table: "idem_inbox", From: 2, To: 2, Partitions: 1},
			"idem_inbox is up to date (schema version 2); created 1 daily partition"},
		{idemstore.MigrateReport{Table: "idem_inbox", From: 1, To: 2},
			"upgraded idem_inbox from version 1 to 2"},
	}
	for _, c := range cases {
		if got := c.r.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.r, got, c.want)
		}
	}
	if got := idemstore.Layout(7).String(); got != "Layout(7)" {
		t.Errorf("unknown layout: %q", got)
	}
}

func TestDurabilitySummaryIsSorted(t *testing.T) {
	d := idemstore.Durability{Settings: map[string]string{"synchronous_commit": "on", "fsync": "on", "standbys": "0"}}
	if got, want := d.Summary(), "fsync=on, standbys=0, synchronous_commit=on"; got != want {
		t.Fatalf("summary %q, want %q", got, want)
	}
	r := idemstore.DurabilityRisk{What: "no standby", Fix: "add one"}
	if got := r.String(); got != "no standby (fix: add one)" {
		t.Fatalf("risk %q", got)
	}
}

// countingStore wraps a store to count its commits: embedding the wrapped
// Store forwards every other method, so the wrapper keeps each capability
// of the store it wraps.
type countingStore struct {
	idemstore.Store[struct{}]
	commits int
}

func (s *countingStore) Commit(ctx context.Context, tx struct{}) error {
	s.commits++
	return s.Store.Commit(ctx, tx)
}

func TestWrapperForwardsEveryMethod(t *testing.T) {
	var s idemstore.Store[struct{}] = &countingStore{Store: windowed{}}
	if w := s.Window(); w != time.Hour {
		t.Fatalf("wrapped store's window %v, want the inner store's 1h", w)
	}
	if err := s.Commit(context.Background(), struct{}{}); err != nil || s.(*countingStore).commits != 1 {
		t.Fatalf("commit through the wrapper: %v, %d counted", err, s.(*countingStore).commits)
	}
}

type windowed struct{ nopstore.Store[struct{}] }

func (windowed) Window() time.Duration { return time.Hour }
