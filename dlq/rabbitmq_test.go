package dlq

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
)

// A poison message, dead-lettered by a consumer whose handler fails
// permanently: list groups it under its reason, show says a redrive
// applies it, a dry run changes nothing, and after the fix a redrive
// makes the fixed consumer apply it exactly once.
func TestRedrivePoisonAfterFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	e.poison("inv-1", "inv-2")
	src := e.source()

	ls, err := List(ctx, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Total != 2 || len(ls.Groups) != 1 {
		t.Fatalf("listing %+v, want 2 letters in one group", ls)
	}
	g := ls.Groups[0]
	if g.Count != 2 || g.Consumer != e.consumer || !strings.Contains(g.Reason, errPoison.Error()) || g.MinAttempts < 1 || g.Oldest.IsZero() || g.Newest.Before(g.Oldest) {
		t.Fatalf("group %+v", g)
	}
	// Reading left the queue as it was.
	if n := e.depth(e.topo.DeadLetterQueue); n != 2 {
		t.Fatalf("after list the DLQ holds %d, want 2", n)
	}

	sh, err := Show(ctx, src, e.inbox, "inv-1")
	if err != nil {
		t.Fatal(err)
	}
	if sh.Judgement.Verdict != Apply || sh.Letter.Target != e.topo.Queue || string(sh.Letter.Body) != `{"invoice":"inv-1"}` || sh.Letter.Headers[HeaderConsumer] != e.consumer {
		t.Fatalf("show: %+v", sh)
	}
	if _, err := Show(ctx, src, e.inbox, "inv-404"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("show of a missing ID: %v, want ErrNotFound", err)
	}

	// Dry run: a report, no change.
	res, err := Redrive(ctx, src, e.inbox, Selection{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || res.Matched != 2 || res.Done != 0 || res.ByVerdict()[Apply] != 2 {
		t.Fatalf("dry run: %+v", res)
	}
	if d, q := e.depth(e.topo.DeadLetterQueue), e.depth(e.topo.Queue); d != 2 || q != 0 {
		t.Fatalf("after a dry run: DLQ %d, queue %d; want 2, 0", d, q)
	}

	// The fix is deployed; redrive one by ID, then the other by reason.
	res, err = Redrive(ctx, src, e.inbox, Selection{Filter: Filter{IDs: []string{"inv-2"}}, Apply: true, Rate: 50})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 1 || res.Done != 1 || !res.Items[0].Done || res.Items[0].ID != "inv-2" {
		t.Fatalf("redrive by ID: %+v", res)
	}
	res, err = Redrive(ctx, src, e.inbox, Selection{Filter: Filter{Reason: "tax rate", Consumer: e.consumer}, Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 1 || res.Done != 1 || res.Items[0].ID != "inv-1" {
		t.Fatalf("redrive by reason: %+v", res)
	}
	if d, q := e.depth(e.topo.DeadLetterQueue), e.depth(e.topo.Queue); d != 0 || q != 2 {
		t.Fatalf("after redrive: DLQ %d, queue %d; want 0, 2", d, q)
	}
	// The redriven copies carry the message ID and the redrive count, not
	// the dead-letter headers.
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(e.topo.Queue, false)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if d.MessageId == "" || d.Headers[HeaderRedriven] != int64(1) || d.Headers[HeaderReason] != nil || d.Headers[HeaderConsumer] != nil {
		t.Fatalf("redriven copy: id %q headers %v", d.MessageId, d.Headers)
	}
	_ = ch.Close() // returns it

	out := e.consume(2, false)
	for _, id := range []string{"inv-1", "inv-2"} {
		if o := out[id]; len(o) != 1 || o[0] != idem.Applied {
			t.Fatalf("%s: outcomes %v, want one applied", id, o)
		}
		if n := e.effects(id); n != 1 {
			t.Fatalf("%s applied %d times, want once", id, n)
		}
	}
}

// A letter whose key was applied since (the same message arrived again
// and the fixed consumer applied it): show says duplicate, a redrive sends
// it, and the consumer acks it as a duplicate without a second effect.
func TestRedriveOfAppliedKeyIsDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	e.poison("inv-7")
	e.publish(invoice("inv-7"))
	if out := e.consume(1, false); out["inv-7"][0] != idem.Applied {
		t.Fatalf("outcomes %v", out)
	}
	src := e.source()
	sh, err := Show(ctx, src, e.inbox, "inv-7")
	if err != nil {
		t.Fatal(err)
	}
	if sh.Judgement.Verdict != Duplicate || sh.Judgement.Marker == nil || sh.Judgement.Marker.MessageID != "inv-7" {
		t.Fatalf("show: %+v", sh.Judgement)
	}
	res, err := Redrive(ctx, src, e.inbox, Selection{Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 1 || res.Items[0].Judgement.Verdict != Duplicate {
		t.Fatalf("redrive: %+v", res)
	}
	out := e.consume(1, false)
	if o := out["inv-7"]; len(o) != 1 || o[0] != idem.Duplicate {
		t.Fatalf("outcomes %v, want one duplicate", o)
	}
	if d, q, n := e.depth(e.topo.DeadLetterQueue), e.depth(e.topo.Queue), e.effects("inv-7"); d != 0 || q != 0 || n != 1 {
		t.Fatalf("DLQ %d, queue %d, effects %d; want 0, 0, 1 (the duplicate was acked)", d, q, n)
	}
}

// The connection dies after the broker confirmed the republish and before
// the dead-letter copy was acked: the copy stays in the DLQ, the republish
// is in the queue. The consumer applies it once; a second redrive of the
// copy left behind is a duplicate the inbox absorbs. Nothing lost, nothing
// applied twice.
func TestCrashBetweenConfirmAndAck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	e.poison("inv-3")
	src := e.source()
	src.afterConfirm = func(*Letter) { _ = src.conn.Close() }
	res, err := Redrive(ctx, src, e.inbox, Selection{Apply: true})
	if err == nil {
		t.Fatalf("redrive over a dead connection succeeded: %+v", res)
	}
	if len(res.Items) != 1 || res.Items[0].Done || !res.Items[0].Sent {
		t.Fatalf("items %+v, want one sent and not done", res.Items)
	}
	if d, q := e.settledDepth(e.topo.DeadLetterQueue, 1), e.depth(e.topo.Queue); d != 1 || q != 1 {
		t.Fatalf("after the crash: DLQ %d, queue %d; want 1, 1 (one copy each)", d, q)
	}
	if out := e.consume(1, false); out["inv-3"][0] != idem.Applied {
		t.Fatalf("outcomes %v", out)
	}
	src2 := e.source()
	res, err = Redrive(ctx, src2, e.inbox, Selection{Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 1 || res.Items[0].Judgement.Verdict != Duplicate {
		t.Fatalf("second redrive: %+v", res)
	}
	if out := e.consume(1, false); out["inv-3"][0] != idem.Duplicate {
		t.Fatalf("outcomes %v, want duplicate", out)
	}
	if d, q, n := e.depth(e.topo.DeadLetterQueue), e.depth(e.topo.Queue), e.effects("inv-3"); d != 0 || q != 0 || n != 1 {
		t.Fatalf("DLQ %d, queue %d, effects %d; want 0, 0, 1", d, q, n)
	}
}

// A replay retires the marker to the audit table, with who and why, and
// redrives: the consumer applies the message once more. A dry run of the
// replay retires nothing.
func TestReplayRetiresMarkerAndAppliesOnceMore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	e.poison("inv-9")
	e.publish(invoice("inv-9"))
	e.consume(1, false)
	src := e.source()
	who := Retirement{By: "alice", Why: "INC-42: invoice voided by hand, issue it again"}
	if _, err := Replay(ctx, src, e.inbox, Selection{Apply: true}, who); err == nil {
		t.Fatal("a replay without IDs ran")
	}
	if _, err := Replay(ctx, src, e.inbox, Selection{Filter: Filter{IDs: []string{"inv-9"}}}, Retirement{By: "alice"}); err == nil {
		t.Fatal("a replay without a why ran")
	}
	res, err := Replay(ctx, src, e.inbox, Selection{Filter: Filter{IDs: []string{"inv-9"}}}, who)
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || res.Items[0].Retired != nil || res.Items[0].Judgement.Verdict != Duplicate {
		t.Fatalf("dry replay: %+v", res)
	}
	if sh, _ := Show(ctx, src, e.inbox, "inv-9"); sh.Judgement.Verdict != Duplicate {
		t.Fatalf("after a dry replay the marker is gone: %+v", sh.Judgement)
	}
	if rs, err := e.inbox.RetiredMarkers(ctx, "", 0); err != nil || len(rs) != 0 {
		t.Fatalf("after a dry replay: audit rows %v, %v", rs, err)
	}

	res, err = Replay(ctx, src, e.inbox, Selection{Filter: Filter{IDs: []string{"inv-9"}}, Apply: true}, who)
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 1 || res.Items[0].Retired == nil || res.Items[0].Retired.Key != "inv-9" {
		t.Fatalf("replay: %+v", res)
	}
	rs, err := e.inbox.RetiredMarkers(ctx, e.consumer, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].RetiredBy != "alice" || rs[0].Why != who.Why || rs[0].Consumer != e.consumer || rs[0].MessageID != "inv-9" ||
		rs[0].ReplayOf != "inv-9" || rs[0].ProcessedAt.IsZero() || len(rs[0].BodySHA256) == 0 || time.Since(rs[0].RetiredAt) > time.Hour {
		t.Fatalf("audit rows %+v", rs)
	}
	out := e.consume(1, false)
	if o := out["inv-9"]; len(o) != 1 || o[0] != idem.Applied {
		t.Fatalf("outcomes %v, want applied", o)
	}
	if n := e.effects("inv-9"); n != 2 {
		t.Fatalf("effects %d, want 2 (applied once more)", n)
	}
	// The audit row is kept, and the marker is back.
	var markers, audit int
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idem_inbox WHERE key = 'inv-9'), (SELECT count(*) FROM idem_inbox_retired WHERE key = 'inv-9')`).Scan(&markers, &audit); err != nil {
		t.Fatal(err)
	}
	if markers != 1 || audit != 1 {
		t.Fatalf("markers %d, audit rows %d; want 1, 1", markers, audit)
	}
	if _, err := e.inbox.Retire(ctx, "inv-nope", e.consumer, "inv-nope", who); !errors.Is(err, ErrNoMarker) {
		t.Fatalf("retiring a missing marker: %v", err)
	}
}

// Purge: a dry run removes nothing; with a filter only the matched go.
func TestPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	e.poison("inv-a", "inv-b", "inv-c")
	src := e.source()
	res, err := Purge(ctx, src, e.inbox, Selection{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || res.Matched != 3 || res.Done != 0 {
		t.Fatalf("dry purge %+v", res)
	}
	if n := e.depth(e.topo.DeadLetterQueue); n != 3 {
		t.Fatalf("after a dry purge the DLQ holds %d", n)
	}
	res, err = Purge(ctx, src, e.inbox, Selection{Filter: Filter{IDs: []string{"inv-b"}}, Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 1 || res.Done != 1 {
		t.Fatalf("purge %+v", res)
	}
	ls, err := src.Peek(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 || ls[0].ID == "inv-b" || ls[1].ID == "inv-b" {
		t.Fatalf("left %v", ls)
	}
	if n := e.depth(e.topo.Queue); n != 0 {
		t.Fatalf("a purge sent %d to the queue", n)
	}
}

// An expired letter (its event time is older than the inbox window) is
// refused by default and stays; with the flag it is sent, with a warning.
func TestRedriveExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	old := invoice("inv-old")
	old.Timestamp = time.Now().Add(-30 * 24 * time.Hour)
	e.publish(old)
	// A consumer with the horizon guard expires it to the DLQ.
	out := e.consume(1, false)
	if o := out["inv-old"]; len(o) != 1 || o[0] != idem.Expired {
		t.Fatalf("outcomes %v, want expired", o)
	}
	src := e.source()
	res, err := Redrive(ctx, src, e.inbox, Selection{Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Refused != 1 || res.Done != 0 || res.Items[0].Judgement.Verdict != Expire || res.Items[0].Action != "refuse" || !strings.Contains(res.Items[0].Why, "window") {
		t.Fatalf("redrive %+v", res)
	}
	if n := e.depth(e.topo.DeadLetterQueue); n != 1 {
		t.Fatalf("the refused letter left the DLQ: %d", n)
	}
	res, err = Redrive(ctx, src, e.inbox, Selection{Apply: true, Expired: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 1 || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "expired") {
		t.Fatalf("redrive --expired %+v", res)
	}
	if d, q := e.depth(e.topo.DeadLetterQueue), e.depth(e.topo.Queue); d != 0 || q != 1 {
		t.Fatalf("DLQ %d queue %d", d, q)
	}
}

// A redrive to a queue that does not exist is returned by the broker: the
// letter stays in the DLQ.
func TestRedriveUnroutableKeepsLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// A dead letter whose origin queue is gone.
	if err := ch.PublishWithContext(ctx, "", e.topo.DeadLetterQueue, false, false, amqp.Publishing{
		MessageId: "inv-lost", Body: []byte("{}"), DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{HeaderReason: "boom", HeaderConsumer: e.consumer, HeaderOrigin: e.topo.Queue + ".gone", HeaderAttempts: int64(1)},
	}); err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()
	for e.depth(e.topo.DeadLetterQueue) != 1 {
		time.Sleep(10 * time.Millisecond)
	}
	src := e.source()
	res, err := Redrive(ctx, src, e.inbox, Selection{Apply: true})
	if err == nil || !strings.Contains(err.Error(), "could not route") {
		t.Fatalf("redrive to a missing queue: %v %+v", err, res)
	}
	if len(res.Items) != 1 || res.Items[0].Sent || res.Items[0].Done || res.Done != 0 {
		t.Fatalf("a returned redrive is reported sent: %+v", res.Items)
	}
	_ = src.Close()
	if n := e.depth(e.topo.DeadLetterQueue); n != 1 {
		t.Fatalf("DLQ holds %d, want the letter kept", n)
	}
}

// Every read of a quorum queue counts as a delivery: a listing warns
// before a delivery limit could bite.
func TestListWarnsOfManyReads(t *testing.T) {
	t.Parallel()
	ls := Summarize("q", []Letter{{ID: "a", Reason: "r", Headers: map[string]string{"x-delivery-count": "3"}}})
	if len(ls.Warnings) != 0 {
		t.Fatalf("warnings %v", ls.Warnings)
	}
	ls = Summarize("q", []Letter{{ID: "a", Reason: "r", Headers: map[string]string{"x-delivery-count": "12"}}})
	if len(ls.Warnings) != 1 || !strings.Contains(ls.Warnings[0], "delivery limit") {
		t.Fatalf("warnings %v", ls.Warnings)
	}
}

// A redrive process killed (SIGKILL) while it works, wherever it was:
// between a republish and its confirm, or a confirm and the ack. Every
// letter is afterwards in the DLQ or the queue (at most the one in flight
// in both), and after a second redrive the consumer applies each exactly
// once.
func TestKillMidRedrive(t *testing.T) {
	if q := os.Getenv("IDEM_DLQ_KILL_CHILD"); q != "" {
		// The child: redrive slowly until killed.
		src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		_, err = Redrive(context.Background(), src, nil, Selection{Apply: true, Rate: 20})
		t.Logf("child redrive ended: %v", err)
		return
	}
	t.Parallel()
	e := newRabbitEnv(t)
	const n = 20
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("inv-k%02d", i)
	}
	e.poison(ids...)
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillMidRedrive$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEM_DLQ_KILL_CHILD="+e.topo.DeadLetterQueue)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	killed := false
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if e.depth(e.topo.Queue) >= 3 {
			_ = cmd.Process.Kill()
			killed = true
			break
		}
	}
	<-exited
	if !killed {
		t.Log("the child finished before it was killed; the invariants still hold")
	}
	// The dead connection's letters return to the DLQ a moment later.
	var d, q int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		d, q = e.depth(e.topo.DeadLetterQueue), e.depth(e.topo.Queue)
		if d+q >= n || time.Now().After(deadline) {
			break
		}
	}
	if d+q < n || d+q > n+1 {
		t.Fatalf("after the kill: DLQ %d + queue %d, want %d (or one more: the letter in flight)", d, q, n)
	}
	t.Logf("after the kill: DLQ %d, queue %d", d, q)
	// A letter the dead connection held can take a moment to be gettable
	// again: redrive until the DLQ is empty, as an operator would.
	src, redriven := e.source(), 0
	for deadline := time.Now().Add(10 * time.Second); redriven < d && time.Now().Before(deadline); {
		res, err := Redrive(context.Background(), src, e.inbox, Selection{Apply: true})
		if err != nil {
			t.Fatalf("second redrive: %v %+v", err, res)
		}
		redriven += res.Done
	}
	if redriven != d {
		t.Fatalf("redrove %d of the %d letters left", redriven, d)
	}
	out := e.consume(d+q, false)
	for _, id := range ids {
		if got := e.effects(id); got != 1 {
			t.Fatalf("%s applied %d times (outcomes %v), want once", id, got, out[id])
		}
	}
	if d, q := e.depth(e.topo.DeadLetterQueue), e.depth(e.topo.Queue); d != 0 || q != 0 {
		t.Fatalf("left: DLQ %d, queue %d", d, q)
	}
}
