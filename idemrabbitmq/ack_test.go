package idemrabbitmq

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The table from the processor's actions to verbs is total: anything it
// does not know is left to the broker.
func TestVerbFor(t *testing.T) {
	t.Parallel()
	want := map[idem.Action]Verb{
		idem.ActionAck:        Ack,
		idem.ActionRedeliver:  Requeue,
		idem.ActionHold:       Hold,
		idem.ActionDeadLetter: DeadLetter,
		0:                     Requeue,
		99:                    Requeue,
	}
	for a, v := range want {
		if got := VerbFor(a); got != v {
			t.Errorf("VerbFor(%v) = %v, want %v", a, got, v)
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

// decided is one decision per verb; requeues wait requeueDelay.
func decided(verbs ...Verb) []decision {
	ds := make([]decision, len(verbs))
	for i, v := range verbs {
		ds[i] = decision{verb: v}
		if v == Requeue {
			ds[i].disp.Delay = requeueDelay
		}
	}
	return ds
}

const requeueDelay = time.Second

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
	// 3 waits for its copy's confirm: 1 and 2 go in one multiple ack, 4
	// and 5 one by one, so that no multiple ack covers 3.
	if got != "ack2* ack4 ack5 " {
		t.Fatalf("got %q", got)
	}
	if got := frames(tr.lettered([]uint64{3})); got != "ack3 " {
		t.Fatalf("after the confirm: got %q", got)
	}
	if tr.len() != 0 {
		t.Fatalf("%d tags left", tr.len())
	}
}

func TestTrackerRequeueWaitsAndIsNeverSwallowed(t *testing.T) {
	t.Parallel()
	var tr tracker
	for tag := uint64(1); tag <= 6; tag++ {
		tr.add(tag)
	}
	now := time.Now()
	due := now.Add(requeueDelay)
	got := frames(tr.finish([]uint64{1, 2, 3}, decided(Ack, Requeue, Ack), now))
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
	got = frames(tr.finish([]uint64{4, 5, 6}, decided(Ack, Ack, Ack), now))
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

// A dead letter is acked once its copy is confirmed, and its frame
// carries the decision made once in the worker: reported as a dead letter,
// not re-derived from the outcome.
func TestTrackerCarriesTheDecisionToTheFrame(t *testing.T) {
	t.Parallel()
	var tr tracker
	tr.add(1)
	tr.add(2)
	republished := decide(idem.Disposition{Action: idem.ActionDeadLetter, Reason: "permanent: no such customer"},
		idem.Result{MessageID: "m1", Outcome: idem.DeadLettered})
	applied := decide(idem.Disposition{Action: idem.ActionAck}, idem.Result{MessageID: "m2", Outcome: idem.Applied})
	now := time.Now()
	if got := frames(tr.finish([]uint64{1}, []decision{republished}, now)); got != "" {
		t.Fatalf("got %q, want nothing before the dead letter is confirmed", got)
	}
	ops := tr.lettered([]uint64{1})
	if got := frames(ops); got != "ack1 " {
		t.Fatalf("got %q, want the original acked after its confirm", got)
	}
	if s := ops[0].settled; len(s) != 1 || s[0] != republished {
		t.Fatalf("settled %+v", s)
	}
	ops = tr.finish([]uint64{2}, []decision{applied}, now)
	if s := ops[0].settled; frames(ops) != "ack2 " || s[0].verb != Ack || s[0].res.MessageID != "m2" {
		t.Fatalf("got %q, settled %+v", frames(ops), s)
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
	if got := frames(tr.finish([]uint64{1, 2}, decided(Hold, Ack), now)); got != "ack2 " {
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
