package dlq

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
)

// A poison message, dead-lettered by a consumer whose handler fails
// permanently: list groups it under its reason, show says a redrive
// applies it, a dry run changes nothing, and after the fix a redrive
// makes the fixed consumer apply it exactly once.
// TestRedrivePoisonAfterFix runs list, show and redrive on a pool of pgx's
// default size and on a pool of one connection.
func TestRedrivePoisonAfterFix(t *testing.T) {
	t.Parallel()
	for _, conns := range []int{0, 1} {
		t.Run(fmt.Sprintf("conns=%d", conns), func(t *testing.T) {
			t.Parallel()
			redrivePoisonAfterFix(t, conns)
		})
	}
}

func redrivePoisonAfterFix(t *testing.T, conns int) {
	ctx := context.Background()
	e := newRabbitEnvOf(t, conns)
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
	if sh.Judgement.Verdict != Apply || sh.Letter.Target != e.topo.Queue || string(sh.Letter.Body) != `{"invoice":"inv-1"}` || sh.Letter.Headers[idembroker.HeaderConsumer] != e.consumer {
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
	if d.MessageId == "" || d.Headers[idembroker.HeaderRedriven] != int64(1) || d.Headers[idembroker.HeaderReason] != nil || d.Headers[idembroker.HeaderConsumer] != nil {
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
	for _, conns := range []int{0, 1} {
		t.Run(fmt.Sprintf("conns=%d", conns), func(t *testing.T) {
			t.Parallel()
			replayRetiresMarkerAndAppliesOnceMore(t, conns)
		})
	}
}

func replayRetiresMarkerAndAppliesOnceMore(t *testing.T, conns int) {
	ctx := context.Background()
	e := newRabbitEnvOf(t, conns)
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
		Headers: amqp.Table{idembroker.HeaderReason: "boom", idembroker.HeaderConsumer: e.consumer, idembroker.HeaderOrigin: e.topo.Queue + ".gone", idembroker.HeaderAttempts: int64(1)},
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

// killAt is the republish whose confirm the child of TestKillMidRedrive
// dies after, with killedCode.
const (
	killAt     = 3
	killedCode = 42
)

// A redrive process that dies between the broker's confirm of a
// republish and the ack of its dead-letter copy (the one window where a
// letter is in both places): every letter is afterwards in the DLQ or
// the queue, the one in flight in both, and after a second redrive the
// consumer applies each exactly once.

func TestKillMidRedrive(t *testing.T) {
	if q := os.Getenv("IDEM_DLQ_KILL_CHILD"); q != "" {
		// The child: redrive, and die between the confirm of the third
		// republish and the ack of its dead-letter copy.
		src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		src.afterConfirm = func(*Letter) {
			if n++; n == killAt {
				os.Exit(killedCode)
			}
		}
		_, err = Redrive(context.Background(), src, nil, Selection{Apply: true})
		t.Fatalf("child redrive ended without being killed: %v", err)
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
	childOut, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != killedCode {
		t.Fatalf("the child was not killed inside the confirm-to-ack window: %v\n%s", err, childOut)
	}
	// Letters 1 and 2 were acked; letter 3 was confirmed in the queue and
	// not acked: it returns to the DLQ too.
	d, q := e.settledDepth(e.topo.DeadLetterQueue, n-killAt+1), e.settledDepth(e.topo.Queue, killAt)
	if d != n-killAt+1 || q != killAt {
		t.Fatalf("after the kill: DLQ %d, queue %d; want %d and %d (the letter in flight in both)", d, q, n-killAt+1, killAt)
	}
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

// deadLetter puts a letter of message id into the DLQ by hand, as the
// consumer would have dead-lettered it; origin is where it came from.
func (e *rabbitEnv) deadLetter(id, origin string, at time.Time) {
	e.t.Helper()
	ch, err := e.conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.PublishWithContext(context.Background(), "", e.topo.DeadLetterQueue, false, false, amqp.Publishing{
		MessageId: id, Timestamp: at, DeliveryMode: amqp.Persistent, Body: []byte(`{"invoice":"` + id + `"}`),
		Headers: amqp.Table{idembroker.HeaderReason: "boom", idembroker.HeaderConsumer: e.consumer, idembroker.HeaderOrigin: origin, idembroker.HeaderAttempts: int64(1)},
	}); err != nil {
		e.t.Fatal(err)
	}
}

// markers counts the inbox's markers and the audit table's rows.
func (e *rabbitEnv) markers() (markers, audit int) {
	e.t.Helper()
	ctx := context.Background()
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&markers); err != nil {
		e.t.Fatal(err)
	}
	rs, err := e.inbox.RetiredMarkers(ctx, "", 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return markers, len(rs)
}

// The consumer checks the horizon before it claims the key: a letter
// older than the window is expired even when its key still has a marker
// (past keep_until, not yet pruned). Show says expire, and a replay
// without the expired flag refuses it and retires nothing.
func TestExpiredLetterWithMarkerIsExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	old := invoice("inv-old")
	old.Timestamp = time.Now().Add(-20 * 24 * time.Hour)
	e.publish(old)
	if o := e.consume(1, false)["inv-old"]; len(o) != 1 || o[0] != idem.Expired {
		t.Fatalf("outcomes %v, want expired", o)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until)
		VALUES ($1, 'inv-old', 'inv-old', '\x00', now() - interval '15 days', now() - interval '1 hour')`, e.consumer); err != nil {
		t.Fatal(err)
	}
	if d := e.settledDepth(e.topo.DeadLetterQueue, 1); d != 1 {
		t.Fatalf("DLQ holds %d, want the expired message", d)
	}
	src := e.source()
	sh, err := Show(ctx, src, e.inbox, "inv-old")
	if err != nil {
		t.Fatal(err)
	}
	if sh.Judgement.Verdict != Expire || !strings.Contains(sh.Judgement.Why, "before it looks at any marker") {
		t.Errorf("show: %s (%s), want expire", sh.Judgement.Verdict, sh.Judgement.Why)
	}
	res, err := Replay(ctx, src, e.inbox, Selection{Filter: Filter{IDs: []string{"inv-old"}}, Apply: true}, Retirement{By: "alice", Why: "INC-1"})
	if err != nil {
		t.Fatal(err)
	}
	if m, a := e.markers(); res.Refused != 1 || res.Done != 0 || m != 1 || a != 0 {
		t.Errorf("replay of an expired letter: refused %d, done %d, markers %d, audit rows %d; want 1, 0, 1, 0", res.Refused, res.Done, m, a)
	}
}

// A letter that names no consumer (the broker dead-lettered it at its
// delivery limit) is still refused when it has no ID or is past the
// horizon, and one that is neither is refused as unknown when an inbox
// was given: nothing is sent without a verdict.
func TestUnknownConsumerLettersRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, p := range []amqp.Publishing{
		{MessageId: "", Timestamp: time.Now(), Body: []byte(`{}`)},
		{MessageId: "inv-old", Timestamp: time.Now().Add(-30 * 24 * time.Hour), Body: []byte(`{}`)},
		{MessageId: "inv-new", Timestamp: time.Now(), Body: []byte(`{}`)},
	} {
		p.DeliveryMode = amqp.Persistent
		p.Headers = amqp.Table{"x-first-death-queue": e.topo.Queue, "x-first-death-reason": "delivery_limit"}
		if err := ch.PublishWithContext(ctx, "", e.topo.DeadLetterQueue, false, false, p); err != nil {
			t.Fatal(err)
		}
	}
	e.settledDepth(e.topo.DeadLetterQueue, 3)
	res, err := Redrive(ctx, e.source(), e.inbox, Selection{Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Verdict{}
	for _, it := range res.Items {
		got[it.ID] = it.Judgement.Verdict
	}
	if res.Refused != 3 || res.Done != 0 || len(res.Warnings) != 0 || got[""] != Invalid || got["inv-old"] != Expire || got["inv-new"] != Unknown {
		t.Errorf("redrive: done %d, refused %d, warnings %v, verdicts %v; want 0 done, 3 refused (invalid, expire, unknown), no warning", res.Done, res.Refused, res.Warnings, got)
	}
	if d := e.settledDepth(e.topo.DeadLetterQueue, 3); d != 3 {
		t.Errorf("DLQ holds %d, want the 3 refused", d)
	}
}

// Two copies of one message in the DLQ (dead-lettered twice, or a copy
// left by a crash between confirm and ack) and a running consumer that
// applies the first before the second is judged: one replay retires the
// marker once, the second copy is redriven plainly, and the message is
// applied once more, not twice. A later replay of a copy left behind is
// refused: the marker there is the replay's own.
func TestReplayOfTwoCopiesAppliesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	e.publish(invoice("inv-9"), invoice("inv-9"))
	if o := e.consume(2, true)["inv-9"]; len(o) != 2 {
		t.Fatalf("outcomes %v", o)
	}
	e.publish(invoice("inv-9"))
	e.consume(1, false) // applied once: the marker exists
	s := &settled{}
	proc, err := idem.NewProcessor(e.store, &idem.Config[pgx.Tx]{Consumer: e.consumer, Key: idem.ByMessageID,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: amqpURL(), Queue: e.topo.Queue, BatchSize: 1, Hooks: []idem.Hook{s}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = c.Run(cctx) }()
	src := e.source()
	// The consumer applies the first copy before the walk judges the
	// second: the marker is back by then.
	applied := false
	src.afterConfirm = func(*Letter) {
		for deadline := time.Now().Add(30 * time.Second); !applied && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			applied = e.effects("inv-9") == 2
		}
	}
	sel := Selection{Filter: Filter{IDs: []string{"inv-9"}}, Apply: true}
	ret := Retirement{By: "alice", Why: "INC-9: invoice voided by hand, issue it once more"}
	res, err := Replay(ctx, src, e.inbox, sel, ret)
	if err != nil {
		t.Fatal(err)
	}
	if !applied {
		t.Fatal("the consumer did not apply the first copy within 30s")
	}
	for deadline := time.Now().Add(30 * time.Second); s.n.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if len(res.Items) != 2 || res.Items[0].Retired == nil || res.Items[1].Retired != nil || res.Done != 2 {
		t.Fatalf("replay items %+v, want the first retired and both done", res.Items)
	}
	if o := s.outcomes()["inv-9"]; len(o) != 2 || o[0] != idem.Applied || o[1] != idem.Duplicate {
		t.Errorf("consumer outcomes %v, want applied then duplicate", o)
	}
	if n, _ := e.effects("inv-9"), 0; n != 2 {
		t.Errorf("effects of inv-9: %d, want 2 (the first and once more)", n)
	}
	if _, a := e.markers(); a != 1 {
		t.Errorf("audit rows %d, want 1", a)
	}

	// A copy left behind (a crash between the confirm and the ack) and the
	// same replay run again: refused, nothing retired, nothing applied.
	e.deadLetter("inv-9", e.topo.Queue, time.Now())
	e.settledDepth(e.topo.DeadLetterQueue, 1)
	for _, apply := range []bool{false, true} {
		sel.Apply = apply
		res, err = Replay(ctx, e.source(), e.inbox, sel, ret)
		if err != nil {
			t.Fatal(err)
		}
		if res.Refused != 1 || res.Done != 0 || !strings.Contains(res.Items[0].Why, "already replayed") {
			t.Fatalf("replay again (apply %v): %+v, want refused as already replayed", apply, res)
		}
	}
	if n, _ := e.effects("inv-9"), 0; n != 2 {
		t.Errorf("effects of inv-9 after the rerun: %d, want 2", n)
	}
	if m, a := e.markers(); m != 1 || a != 1 {
		t.Errorf("markers %d, audit rows %d after the rerun; want 1, 1", m, a)
	}
	if d := e.settledDepth(e.topo.DeadLetterQueue, 1); d != 1 {
		t.Errorf("DLQ holds %d, want the refused copy", d)
	}
}

// A replay whose republish fails (the broker returns it: its origin queue
// is gone) puts the retired marker back, and the audit table has a row
// for it that names the retirement's row, in one transaction.
func TestReplayRestoresMarkerWhenRepublishFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ($1, 'inv-5', 'inv-5', '\x01')`, e.consumer); err != nil {
		t.Fatal(err)
	}
	e.deadLetter("inv-5", e.topo.Queue+".renamed", time.Now())
	e.settledDepth(e.topo.DeadLetterQueue, 1)
	res, err := Replay(ctx, e.source(), e.inbox, Selection{Filter: Filter{IDs: []string{"inv-5"}}, Apply: true}, Retirement{By: "alice", Why: "INC-5"})
	if err == nil || !strings.Contains(err.Error(), "could not route") {
		t.Fatalf("replay to a queue that is gone: %v, want the broker's return", err)
	}
	if len(res.Items) != 1 || res.Items[0].Retired == nil || res.Items[0].Restored == nil || res.Items[0].Sent {
		t.Fatalf("items %+v, want one retired, then restored, not sent", res.Items)
	}
	var msgID string
	var sum []byte
	if err := e.pool.QueryRow(ctx, `SELECT message_id, body_sha256 FROM idem_inbox WHERE consumer = $1 AND key = 'inv-5'`, e.consumer).Scan(&msgID, &sum); err != nil {
		t.Fatalf("the marker is not back: %v", err)
	}
	if msgID != "inv-5" || len(sum) != 1 || sum[0] != 1 {
		t.Errorf("restored marker %q %x, want the original", msgID, sum)
	}
	rs, err := e.inbox.RetiredMarkers(ctx, e.consumer, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Restores != rs[1].ID || rs[1].Restores != 0 || !strings.HasPrefix(rs[0].Why, "restored: ") {
		t.Fatalf("audit rows %+v, want the retirement and the restoration naming it", rs)
	}
	if d := e.settledDepth(e.topo.DeadLetterQueue, 1); d != 1 {
		t.Errorf("DLQ holds %d, want the letter", d)
	}
	// The restored marker is a marker like any: a replay once the origin
	// is back retires it again (not "already replayed").
	res, err = Replay(ctx, e.source(), e.inbox, Selection{Filter: Filter{IDs: []string{"inv-5"}}}, Retirement{By: "alice", Why: "INC-5"})
	if err != nil || res.Refused != 0 || res.Items[0].Judgement.Verdict != Duplicate {
		t.Fatalf("dry replay after the restore: %v %+v", err, res)
	}
}

// limitedDLQ declares a quorum queue with a delivery limit of 3 and no
// dead-letter exchange, as a DLQ under a policy or a user's declaration
// would be: a letter delivered and given back more than three times is
// dropped for good. It holds letters with ids, in order, without an
// origin (a redrive refuses them); an empty id is a letter without one.
func limitedDLQ(t *testing.T, ids ...string) (*amqp.Connection, string) {
	t.Helper()
	ctx := context.Background()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q := uniqueName(t)
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-delivery-limit": int64(3)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent,
			Timestamp: time.Now().Add(-time.Duration(len(ids)-i) * time.Minute).Truncate(time.Second), ContentType: "application/json",
			Body: []byte(fmt.Sprintf(`{"n":%d}`, i)), Headers: amqp.Table{idembroker.HeaderReason: "boom", idembroker.HeaderConsumer: "billing", idembroker.HeaderAttempts: int64(5)}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publishing letter %d: %v %v", i, ok, err)
		}
	}
	return conn, q
}

// readyDepth is the count of ready messages in queue q.
func readyDepth(t *testing.T, conn *amqp.Connection, q string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

// letterIDs are the IDs of ls, in order, an ID-less letter written "-",
// with their positions.
func letterIDs(ls []Letter) string {
	var b strings.Builder
	for _, l := range ls {
		id := l.ID
		if id == "" {
			id = "-"
		}
		fmt.Fprintf(&b, "%s@%s ", id, l.Position)
	}
	return b.String()
}

// Reading a DLQ spends no delivery: on a quorum queue that drops a
// letter given back more than three times, a hundred rounds of listings
// (whole and partial), shows, dry runs and refused redrives leave every
// letter there, in the order it had, with no delivery counted.
func TestReadingIsFreeUnderDeliveryLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ids := []string{"inv-1", "inv-2", "", "inv-4", "inv-5"}
	conn, q := limitedDLQ(t, ids...)
	src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	first, err := src.Peek(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := letterIDs(first)
	if want != "inv-1@#1 inv-2@#2 -@#3 inv-4@#4 inv-5@#5 " {
		t.Fatalf("first read: %s", want)
	}
	// A hundred reads of every kind, and after every fifth the letters
	// are all there, in the order a read found.
	for round := 1; round <= 100; round++ {
		switch round % 5 {
		case 0:
			ls, err := List(ctx, src, 0)
			if err != nil {
				t.Fatalf("round %d: list: %v", round, err)
			}
			if ls.Total != len(ids) || len(ls.Warnings) != 0 {
				t.Fatalf("round %d: the listing holds %d letters (warnings %q), want %d: letters dropped", round, ls.Total, ls.Warnings, len(ids))
			}
		case 1:
			part, err := src.Peek(ctx, 2)
			if err != nil || letterIDs(part) != "inv-1@#1 inv-2@#2 " {
				t.Fatalf("round %d: a read of two: %s %v", round, letterIDs(part), err)
			}
		case 2:
			id := []string{"inv-1", "inv-2", "inv-4", "inv-5"}[round/5%4]
			sh, err := Show(ctx, src, nil, id)
			if err != nil || sh.Letter.ID != id {
				t.Fatalf("round %d: show %s: %+v %v", round, id, sh.Letter, err)
			}
			if c := sh.Letter.Headers["x-delivery-count"]; c != "" && c != "0" {
				t.Fatalf("round %d: letter %s was counted delivered %s times", round, id, c)
			}
		case 3:
			dry, err := Redrive(ctx, src, nil, Selection{})
			if err != nil || dry.Matched != len(ids) || !dry.DryRun {
				t.Fatalf("round %d: dry run %+v %v", round, dry, err)
			}
		case 4:
			// Nowhere to send them: every letter is refused and stays.
			res, err := Redrive(ctx, src, nil, Selection{Apply: true})
			if err != nil || res.Refused != len(ids) || res.Done != 0 {
				t.Fatalf("round %d: refused redrive %+v %v", round, res, err)
			}
			all, err := src.Peek(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := letterIDs(all); got != want {
				t.Fatalf("round %d: letters %s, want %s (the order a read found)", round, got, want)
			}
		}
	}
	if n := readyDepth(t, conn, q); n != len(ids) {
		t.Fatalf("the queue holds %d messages after the reads, want %d", n, len(ids))
	}
	// What a read copies back is the letter: properties, headers, body.
	last, err := src.Peek(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range last {
		if !first[i].Time.Equal(last[i].Time) || string(first[i].Body) != string(last[i].Body) || first[i].Reason != last[i].Reason ||
			first[i].Attempts != last[i].Attempts || first[i].Consumer != last[i].Consumer || len(first[i].Headers) != len(last[i].Headers) {
			t.Fatalf("letter %d changed:\nfirst %+v\nnow   %+v", i, first[i], last[i])
		}
	}
}

// afterCopyCode is the exit code the child of TestKillMidRead must not
// reach: it is killed first.
const afterCopyCode = 43

// A reader SIGKILLed between the confirm of a letter's copy and the
// acknowledgement of the letter (the one window where a letter is in the
// queue twice) loses nothing: every letter is read afterwards, each once,
// and the listing says some are held twice.
func TestKillMidRead(t *testing.T) {
	if q := os.Getenv("IDEM_DLQ_KILL_READ"); q != "" {
		src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		src.afterCopy = func(n int) {
			if n == 3 {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
		_, _ = List(context.Background(), src, 0)
		os.Exit(afterCopyCode)
	}
	t.Parallel()
	ctx := context.Background()
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("inv-r%02d", i)
	}
	conn, q := limitedDLQ(t, ids...)
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillMidRead$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEM_DLQ_KILL_READ="+q)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed inside the confirm-to-ack window: %v\n%s", err, out)
	}
	src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// The letters the dead connection held come back a moment later: the
	// listing is read once one of them is back beside its copy.
	for deadline := time.Now().Add(30 * time.Second); readyDepth(t, conn, q) < len(ids)+1 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	var ls Listing
	for deadline := time.Now().Add(30 * time.Second); ; {
		if ls, err = List(ctx, src, 0); err != nil {
			t.Fatal(err)
		}
		if ls.Total == len(ids) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	all, err := src.Peek(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, l := range all {
		seen[l.ID]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("letter %s read %d times after the kill, want once: %s", id, seen[id], letterIDs(all))
		}
	}
	// Letters 1 and 2 were copied and acknowledged; the third was copied
	// and not acknowledged, so it is there twice.
	if n := readyDepth(t, conn, q); n < len(ids)+1 {
		t.Fatalf("the queue holds %d, want at least %d (the letter in the window twice)", n, len(ids)+1)
	}
	if len(src.Warnings()) != 1 || !strings.Contains(src.Warnings()[0], "twice") {
		t.Fatalf("warnings %q, want one about letters held twice", src.Warnings())
	}
	if len(ls.Warnings) != 1 {
		t.Fatalf("listing warnings %q", ls.Warnings)
	}
}

// Two readers at once (a console and a command line) never lose or
// double a letter: each may see a letter the other copied back, but the
// queue holds every letter once when they are done.
func TestConcurrentReadsLoseNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = fmt.Sprintf("inv-c%02d", i)
	}
	conn, q := limitedDLQ(t, ids...)
	errc := make(chan error, 2)
	for range 2 {
		src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		go func() {
			for range 10 {
				if _, err := List(ctx, src, 0); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if n := readyDepth(t, conn, q); n != len(ids) {
		t.Fatalf("the queue holds %d after two readers, want %d", n, len(ids))
	}
	src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	all, err := src.Peek(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, l := range all {
		seen[l.ID]++
		if c := l.Headers["x-delivery-count"]; c != "" && c != "0" {
			t.Fatalf("letter %s counted delivered %s times", l.ID, c)
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("letter %s read %d times, want once: %s", id, seen[id], letterIDs(all))
		}
	}
	if len(src.Warnings()) != 0 {
		t.Fatalf("warnings %q", src.Warnings())
	}
}
