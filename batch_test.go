package idem

import (
	"errors"
	"testing"
)

func TestSkipAfter(t *testing.T) {
	mk := func(id string, o Outcome) *item {
		return &item{msg: Message{ID: id}, res: Result{MessageID: id, Outcome: o}}
	}
	for _, inOrder := range []bool{false, true} {
		a, b, bad, c := mk("a", Applied), mk("b", Retry), mk("bad", DeadLettered), mk("c", 0)
		items := []*item{a, b, bad, c}
		skipAfter(items, b, inOrder)
		if a.skipped || b.skipped || !c.skipped {
			t.Fatalf("inOrder=%v: skipped a=%v b=%v c=%v, want only what follows b", inOrder, a.skipped, b.skipped, c.skipped)
		}
		if bad.skipped != inOrder {
			t.Fatalf("inOrder=%v: bad input after the stop skipped=%v", inOrder, bad.skipped)
		}
		if c.res.Outcome != Retry || !c.res.Blameless || !errors.Is(c.res.Err, ErrNotAttempted) {
			t.Fatalf("skipped message: %+v", c.res)
		}
		if a.res.Outcome != Applied || b.res.Outcome != Retry {
			t.Fatalf("messages before and at the stop changed: %v %v", a.res.Outcome, b.res.Outcome)
		}
	}
}
