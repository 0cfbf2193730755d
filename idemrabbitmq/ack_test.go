package idemrabbitmq

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

func TestVerbFor(t *testing.T) {
	t.Parallel()
	want := map[idem.Outcome]Verb{
		idem.Applied:      Ack,
		idem.Duplicate:    Ack,
		idem.Retry:        Requeue,
		idem.DeadLettered: DeadLetter,
		idem.Expired:      DeadLetter,
		0:                 Requeue, // unknown: the broker keeps it
		99:                Requeue,
	}
	for o, v := range want {
		if got := VerbFor(o); got != v {
			t.Errorf("VerbFor(%v) = %v, want %v", o, got, v)
		}
	}
}

// frames renders ops compactly for comparison.
func frames(ops []op) string {
	s := ""
	for _, o := range ops {
		m := ""
		if o.multiple {
			m = "*"
		}
		s += fmt.Sprintf("%s%d%s ", o.verb, o.tag, m)
	}
	return s
}

// decided is one decision per verb, frame and report alike.
func decided(verbs ...Verb) []decision {
	ds := make([]decision, len(verbs))
	for i, v := range verbs {
		ds[i] = decision{frame: v, verb: v}
	}
	return ds
}

func TestTrackerMultipleAckOnlyOverFinishedTags(t *testing.T) {
	t.Parallel()
	var tr tracker
	for tag := uint64(1); tag <= 6; tag++ {
		tr.add(tag)
	}
	now := time.Now()
	// The second batch (4..6) finishes first: nothing may be acked, since a
	// multiple ack on 6 would cover 1..3, still in the database.
	if got := frames(tr.finish([]uint64{4, 5, 6}, decided(Ack, Ack, Ack), now)); got != "" {
		t.Fatalf("acked past a batch in flight: %q", got)
	}
	// The first batch finishes: one frame acks everything.
	if got := frames(tr.finish([]uint64{1, 2, 3}, decided(Ack, Ack, Ack), now)); got != "ack6* " {
		t.Fatalf("got %q, want one multiple ack on 6", got)
	}
	if tr.len() != 0 {
		t.Fatalf("%d tags left", tr.len())
	}
}

func TestTrackerDeadLetterSplitsTheRun(t *testing.T) {
	t.Parallel()
	var tr tracker
	for tag := uint64(1); tag <= 5; tag++ {
		tr.add(tag)
	}
	got := frames(tr.finish([]uint64{1, 2, 3, 4, 5}, decided(Ack, Ack, DeadLetter, Ack, Ack), time.Now()))
	// The reject goes first and alone; the multiple ack then covers only
	// the acked tags (3 is already settled, so ack 5* does not touch it).
	if got != "dead_letter3 ack5* " {
		t.Fatalf("got %q", got)
	}
}

func TestTrackerRequeueWaitsAndIsNeverSwallowed(t *testing.T) {
	t.Parallel()
	var tr tracker
	for tag := uint64(1); tag <= 6; tag++ {
		tr.add(tag)
	}
	now := time.Now()
	due := now.Add(time.Second)
	got := frames(tr.finish([]uint64{1, 2, 3}, decided(Ack, Requeue, Ack), due))
	// 1 is acked; 3 sits behind a waiting requeue, so it is acked alone: a
	// multiple ack on 3 would ack 2, which must be requeued.
	if got != "ack1 ack3 " {
		t.Fatalf("got %q", got)
	}
	if next, ok := tr.nextDue(); !ok || !next.Equal(due) {
		t.Fatalf("nextDue = %v, %v", next, ok)
	}
	if got := frames(tr.due(now)); got != "" {
		t.Fatalf("requeued before due: %q", got)
	}
	got = frames(tr.finish([]uint64{4, 5, 6}, decided(Ack, Ack, Ack), due))
	if got != "ack4 ack5 ack6 " {
		t.Fatalf("behind a waiting requeue: got %q", got)
	}
	if got := frames(tr.due(due)); got != "requeue2 " {
		t.Fatalf("at due: got %q", got)
	}
	if tr.len() != 0 || tr.nWaiting != 0 {
		t.Fatalf("left %d tags, %d waiting", tr.len(), tr.nWaiting)
	}
}

func TestTrackerIgnoresUnknownTags(t *testing.T) {
	t.Parallel()
	var tr tracker
	tr.add(7)
	// A tag from a channel that died is not in this tracker: never acked.
	if got := frames(tr.finish([]uint64{3}, decided(Ack), time.Now())); got != "" {
		t.Fatalf("acked a foreign tag: %q", got)
	}
}

// A dead letter the consumer republished is acked, and its frame carries
// the decision made once in the worker: reported as a dead letter, not
// re-derived from the outcome.
func TestTrackerCarriesTheDecisionToTheFrame(t *testing.T) {
	t.Parallel()
	var tr tracker
	tr.add(1)
	tr.add(2)
	republished := decision{frame: Ack, verb: DeadLetter, res: idem.Result{MessageID: "m1", Outcome: idem.DeadLettered}}
	applied := decide(idem.Result{MessageID: "m2", Outcome: idem.Applied})
	ops := tr.finish([]uint64{1, 2}, []decision{republished, applied}, time.Now())
	if got := frames(ops); got != "ack2* " {
		t.Fatalf("got %q, want one multiple ack", got)
	}
	if s := ops[0].settled; len(s) != 2 || s[0] != republished || s[1].verb != Ack || s[1].res.MessageID != "m2" {
		t.Fatalf("settled %+v", s)
	}
}

// A held delivery is never covered by a multiple ack, however long the
// database stays down; processed again, it is acked like any other.
func TestTrackerHeldDeliveryIsNeverSwallowed(t *testing.T) {
	t.Parallel()
	var tr tracker
	for tag := uint64(1); tag <= 4; tag++ {
		tr.add(tag)
	}
	now := time.Now()
	if got := frames(tr.finish([]uint64{1, 2}, decided(hold, Ack), now)); got != "ack2 " {
		t.Fatalf("got %q, want 2 acked alone behind the held 1", got)
	}
	if got := frames(tr.due(now.Add(time.Hour))); got != "" {
		t.Fatalf("a held delivery was sent: %q", got)
	}
	tr.process([]uint64{1})
	if got := frames(tr.finish([]uint64{3, 4}, decided(Ack, Ack), now)); got != "" {
		t.Fatalf("acked past the held delivery being processed again: %q", got)
	}
	if got := frames(tr.finish([]uint64{1}, decided(Ack), now)); got != "ack4* " {
		t.Fatalf("got %q, want one multiple ack", got)
	}
	if tr.len() != 0 {
		t.Fatalf("%d tags left", tr.len())
	}
}
