package idemrabbitmq

import (
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
)

// testSession is a session of batches of 3, one worker, a 20ms batch wait.
func testSession(workers int) *session {
	return newSession(&Config{BatchSize: 3, Workers: workers, BatchWait: 20 * time.Millisecond,
		ReconnectBackoff: idem.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}})
}

// deliverN delivers tags from..to.
func deliverN(s *session, from, to uint64, now time.Time) {
	for tag := from; tag <= to; tag++ {
		id := fmt.Sprintf("m%d", tag)
		s.deliver(amqp.Delivery{DeliveryTag: tag, MessageId: id}, idem.Message{ID: id}, now)
	}
}

// verdicts is one decision per verb of b; holds and requeues wait delay.
func verdicts(delay time.Duration, verbs ...Verb) []decision {
	ds := make([]decision, len(verbs))
	for i, v := range verbs {
		ds[i] = decision{verb: v, res: idem.Result{MessageID: fmt.Sprintf("v%d", i)}}
		if v == Hold || v == Requeue {
			ds[i].disp.Delay = delay
		}
	}
	return ds
}

func batchTags(w work) string {
	s := ""
	for _, b := range w.batches {
		s += fmt.Sprint(b.tags())
	}
	return s
}

// A full batch starts at once; a partial one waits for the batch wait,
// and the session asks to be woken then, not before.
func TestSessionGathersBatches(t *testing.T) {
	t.Parallel()
	s := testSession(2)
	now := time.Now()
	deliverN(s, 1, 4, now)
	w, wake := s.next(now)
	if got := batchTags(w); got != "[1 2 3]" {
		t.Fatalf("started %s, want the full batch [1 2 3]", got)
	}
	if !s.intake() {
		t.Fatal("intake closed with a batch of 1 gathering")
	}
	if want := now.Add(20 * time.Millisecond); !wake.Equal(want) {
		t.Fatalf("wake %v, want the batch wait of the partial batch", wake.Sub(now))
	}
	if w, _ := s.next(now.Add(10 * time.Millisecond)); len(w.batches) != 0 {
		t.Fatalf("a partial batch started before its wait: %s", batchTags(w))
	}
	if w, _ := s.next(now.Add(20 * time.Millisecond)); batchTags(w) != "[4]" {
		t.Fatalf("got %s, want [4] once its wait is over", batchTags(w))
	}
}

// With every worker busy, a full batch waits and the session does not ask
// to be woken for it (no busy loop): the worker's batch coming back
// starts it.
func TestSessionWaitsForAFreeWorker(t *testing.T) {
	t.Parallel()
	s := testSession(1)
	now := time.Now()
	deliverN(s, 1, 6, now)
	w, _ := s.next(now)
	first := w.batches[0]
	if s.intake() {
		t.Fatal("intake open with a full batch gathered")
	}
	later := now.Add(time.Second)
	if w, wake := s.next(later); len(w.batches) != 0 || !wake.IsZero() {
		t.Fatalf("with no free worker: started %s, wake %v", batchTags(w), wake)
	}
	if got := frames(s.finished(first, verdicts(0, Ack, Ack, Ack), later)); got != "ack3* " {
		t.Fatalf("got %q", got)
	}
	if w, _ := s.next(later); batchTags(w) != "[4 5 6]" {
		t.Fatalf("got %s, want the waiting batch once the worker is free", batchTags(w))
	}
}

// A held delivery pauses new batches (the database is probably down) and
// is processed again after its delay, alone; once it settles, batches
// flow again.
func TestSessionHoldPausesAndReruns(t *testing.T) {
	t.Parallel()
	s := testSession(2)
	now := time.Now()
	deliverN(s, 1, 3, now)
	w, _ := s.next(now)
	if got := frames(s.finished(w.batches[0], verdicts(time.Second, Ack, Hold, Ack), now)); got != "ack1 ack3 " {
		t.Fatalf("got %q, want 1 and 3 acked alone around the held 2", got)
	}
	deliverN(s, 4, 6, now)
	w, wake := s.next(now)
	if len(w.batches) != 0 || !wake.Equal(now.Add(time.Second)) {
		t.Fatalf("while holding: started %s, wake %v; want nothing until the hold's delay", batchTags(w), wake.Sub(now))
	}
	at := now.Add(time.Second)
	w, _ = s.next(at)
	if got := batchTags(w); got != "[2]" || !w.batches[0].rerun {
		t.Fatalf("at the delay: started %s, want the held [2] again, alone", got)
	}
	if w, _ := s.next(at); len(w.batches) != 0 {
		t.Fatalf("started %s while the held delivery is processed again", batchTags(w))
	}
	s.finished(w.batches[0], verdicts(0, Ack), at)
	if w, _ := s.next(at); batchTags(w) != "[4 5 6]" {
		t.Fatalf("got %s, want intake resumed once the held delivery settled", batchTags(w))
	}
}

// A dead letter waits for its confirm without pausing anything; the
// original is acked only once its copy is confirmed; a failed publish keeps
// it unacked and publishes it again after a backoff.
func TestSessionDeadLettersDoNotPause(t *testing.T) {
	t.Parallel()
	s := testSession(1)
	now := time.Now()
	deliverN(s, 1, 6, now)
	w, _ := s.next(now)
	if got := frames(s.finished(w.batches[0], verdicts(0, Ack, DeadLetter, Ack), now)); got != "ack1 ack3 " {
		t.Fatalf("got %q", got)
	}
	w, _ = s.next(now)
	if len(w.letters) != 1 || w.letters[0].delivery.DeliveryTag != 2 || batchTags(w) != "[4 5 6]" {
		t.Fatalf("got letters %d, batches %s; want the dead letter out and the next batch started", len(w.letters), batchTags(w))
	}
	// The broker blocks the dead-letter connection; batches go on.
	if got := frames(s.finished(w.batches[0], verdicts(0, Ack, Ack, Ack), now)); got != "ack4 ack5 ack6 " {
		t.Fatalf("got %q, want acks one by one around the unconfirmed dead letter", got)
	}
	if got := frames(s.published(w.letters, errors.New("dead letter unroutable"), now)); got != "" {
		t.Fatalf("a dead letter that failed was acked: %q", got)
	}
	w2, wake := s.next(now)
	if len(w2.letters) != 0 || !wake.After(now) {
		t.Fatalf("published again at once (wake %v)", wake.Sub(now))
	}
	w2, _ = s.next(wake)
	if len(w2.letters) != 1 {
		t.Fatalf("not published again after the backoff")
	}
	if got := frames(s.published(w2.letters, nil, wake)); got != "ack2 " {
		t.Fatalf("got %q, want the original acked after the confirm", got)
	}
	if s.tr.len() != 0 {
		t.Fatalf("%d tags left", s.tr.len())
	}
}

// A requeue waits its delay and pauses new batches until it is sent.
func TestSessionRequeueWaits(t *testing.T) {
	t.Parallel()
	s := testSession(1)
	now := time.Now()
	deliverN(s, 1, 3, now)
	w, _ := s.next(now)
	s.finished(w.batches[0], verdicts(time.Second, Requeue, Ack, Ack), now)
	deliverN(s, 4, 6, now)
	w, wake := s.next(now)
	if len(w.batches) != 0 || !wake.Equal(now.Add(time.Second)) {
		t.Fatalf("started %s, wake %v", batchTags(w), wake.Sub(now))
	}
	if got := frames(s.tick(now.Add(time.Second))); got != "requeue1 " {
		t.Fatalf("got %q", got)
	}
	if w, _ := s.next(now.Add(time.Second)); batchTags(w) != "[4 5 6]" {
		t.Fatalf("got %s after the requeue", batchTags(w))
	}
}

// A stop forgets what was gathered, sends requeues at once, leaves held
// deliveries to the channel's close and ends once the batches in the
// database and the dead letters out came back.
func TestSessionStop(t *testing.T) {
	t.Parallel()
	s := testSession(2)
	now := time.Now()
	deliverN(s, 1, 6, now)
	w, _ := s.next(now)
	if len(w.batches) != 2 {
		t.Fatalf("started %s", batchTags(w))
	}
	deliverN(s, 7, 7, now)
	s.finished(w.batches[0], verdicts(time.Hour, Requeue, DeadLetter, Hold), now)
	w2, _ := s.next(now) // the dead letter goes out
	if got := frames(s.stop(now)); got != "requeue1 " {
		t.Fatalf("got %q, want the requeue sent at once", got)
	}
	if s.intake() || s.done() {
		t.Fatalf("intake %v, done %v while a batch and a dead letter are out", s.intake(), s.done())
	}
	if got := frames(s.finished(w.batches[1], verdicts(time.Hour, Ack, Requeue, Hold), now)); got != "ack4 requeue5 " {
		t.Fatalf("got %q", got)
	}
	if s.done() {
		t.Fatal("done with a dead letter unconfirmed")
	}
	if got := frames(s.published(w2.letters, nil, now)); got != "ack2 " {
		t.Fatalf("got %q", got)
	}
	if !s.done() {
		t.Fatal("not done with nothing out")
	}
	// 3 and 6 stay held (the channel's close returns them); 7 was
	// forgotten.
	if s.tr.len() != 2 {
		t.Fatalf("%d tags left, want the 2 held", s.tr.len())
	}
}

// With the prefetch window full, a partial batch starts as soon as a
// worker is free: no delivery can come before an ack, so its wait would
// only idle the worker.
func TestSessionStartsAPartialBatchWhenTheWindowIsFull(t *testing.T) {
	t.Parallel()
	s := newSession(&Config{BatchSize: 3, Prefetch: 4, Workers: 2, BatchWait: 20 * time.Millisecond,
		ReconnectBackoff: idem.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}})
	now := time.Now()
	deliverN(s, 1, 3, now)
	if w, _ := s.next(now); batchTags(w) != "[1 2 3]" {
		t.Fatalf("started %s, want the full batch [1 2 3]", batchTags(w))
	}
	// One more fills the window of 4; a second one could not come.
	deliverN(s, 4, 4, now)
	w, wake := s.next(now.Add(time.Millisecond))
	if got := batchTags(w); got != "[4]" {
		t.Fatalf("with the window full and a worker free, started %q, want [4] at once", got)
	}
	if !wake.IsZero() {
		t.Fatalf("wake %v after the window's batch started, want none", wake.Sub(now))
	}

	// Below the window, a partial batch still waits for its batch wait.
	s = newSession(&Config{BatchSize: 3, Prefetch: 5, Workers: 2, BatchWait: 20 * time.Millisecond,
		ReconnectBackoff: idem.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}})
	deliverN(s, 1, 4, now)
	if w, _ := s.next(now); batchTags(w) != "[1 2 3]" {
		t.Fatalf("started %s, want the full batch [1 2 3]", batchTags(w))
	}
	if w, _ := s.next(now.Add(time.Millisecond)); len(w.batches) != 0 {
		t.Fatalf("a partial batch below the window started before its wait: %s", batchTags(w))
	}
}
