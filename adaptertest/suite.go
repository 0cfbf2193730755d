package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/pgxinbox"
)

// settle bounds how long a check waits for messages to be settled; far
// more than any of them needs on a loaded machine, so that a timeout means
// a consumer that stopped, not a slow one.
const settle = 20 * time.Second

// path is a way messages go through the processor: in batches sharing a
// transaction (the adapter's default batch size), or one at a time.
type path struct {
	name  string
	batch int
}

var paths = []path{{"batch", 0}, {"single", 1}}

// Run runs every check of the suite against h, each as a parallel subtest
// with its own topic and PostgreSQL schema. Each check fails when the
// adapter breaks the contract it names (docs/design.md, sections 1-6, 11, 12).
func Run(t *testing.T, h Harness) {
	t.Helper()
	known := h.Features().Known
	skipKnown := func(t *testing.T, names ...string) {
		for _, n := range names {
			if bug, ok := known[n]; ok {
				t.Skip("known: " + bug)
			}
		}
	}
	each := func(name string, check func(t *testing.T, h Harness, p path)) {
		t.Run(name, func(t *testing.T) {
			for _, p := range paths {
				t.Run(p.name, func(t *testing.T) {
					t.Parallel()
					skipKnown(t, name, name+"/"+p.name)
					check(t, h, p)
				})
			}
		})
	}
	one := func(name string, check func(t *testing.T, h Harness)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			skipKnown(t, name)
			check(t, h)
		})
	}
	each("SameIDTwice", sameIDTwice)
	each("CrashAfterCommit", crashAfterCommit)
	each("CrashBeforeAck", crashBeforeAck)
	each("SettledOnce", settledOnce)
	each("MissingID", missingID)
	each("Poison", poison)
	each("TransientExhausted", transientExhausted)
	one("Expired", expired)
	one("TwoConsumers", twoConsumers)
	for _, o := range []struct {
		name string
		fail func(*netfault.Proxy)
	}{{"Stopped", (*netfault.Proxy).Stop}, {"Frozen", (*netfault.Proxy).Freeze}} {
		for _, s := range []struct {
			name string
			at   strike
		}{{"BetweenMessages", betweenMessages}, {"UnderHandler", underHandler}, {"UnderCommit", underCommit}} {
			one("Outage"+o.name+s.name, func(t *testing.T, h Harness) { outage(t, h, o.fail, s.at) })
		}
	}
	one("MissingInboxTable", missingInboxTable)
	one("InboxTableGone", inboxTableGone)
	one("ShutdownDuringOutage", shutdownDuringOutage)
	one("OutageAtStart", outageAtStart)
	one("NoDeadLetterDestination", noDeadLetterDestination)
	one("DeadLetterDestinationLost", deadLetterDestinationLost)
	each("Ordered", ordered)
	each("PartitionedRepublish", partitionedRepublish)
	one("ConnectionCut", connectionCut)
	// The main paths again with the processor on a pool of one
	// connection: no step of the consumer may ask the pool for a second
	// connection while it holds one (one connection per operation,
	// docs/design.md); such a wait stops the binary with every stack.
	t.Run("PoolOfOne", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name  string
			check func(t *testing.T, h Harness, p path)
		}{{"SameIDTwice", sameIDTwice}, {"CrashAfterCommit", crashAfterCommit}, {"SettledOnce", settledOnce}, {"Poison", poison}, {"TransientExhausted", transientExhausted}} {
			for _, p := range paths {
				t.Run(c.name+"/"+p.name, func(t *testing.T) {
					t.Parallel()
					skipKnown(t, c.name, c.name+"/"+p.name)
					c.check(t, poolOfOne{h}, p)
				})
			}
		}
	})
}

// msg is a message whose body names its ID.
func msg(id string) Message {
	return Message{ID: id, Body: []byte("body of " + id), Timestamp: time.Now()}
}

func msgs(ids ...string) []Message {
	out := make([]Message, len(ids))
	for i, id := range ids {
		out[i] = msg(id)
	}
	return out
}

func seq(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return ids
}

// The same ID delivered twice, in one batch and long after, has one
// effect: the second copy is a Duplicate, acked, never applied
// (docs/design.md 1, 3).
func sameIDTwice(t *testing.T, h Harness, p path) {
	e := newEnv(t, h, pgxinbox.Plain)
	e.publish(msgs("a", "b", "a")...)
	e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{BatchSize: p.batch}))
	e.waitFor(settle, "a acked twice and b once", func() bool { return e.rec.acks("a") >= 2 && e.rec.acks("b") >= 1 })
	e.publish(msg("a"))
	e.waitFor(settle, "the late copy of a acked", func() bool { return e.rec.acks("a") >= 3 })
	if got := e.rec.outcomesOf("a"); slices.Index(got, idem.Applied) < 0 || countOf(got, idem.Duplicate) != 2 {
		t.Errorf("outcomes of a: %v; want one Applied and two Duplicates", got)
	}
	e.wantEffects("a", "b")
	e.wantNoDeadLetters()
}

func countOf[T comparable](s []T, v T) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// A crash between the database commit and the ack (the processor's
// AfterCommit fault, once) leaves the message to redelivery, which finds
// its marker: one effect (docs/design.md 4).
func crashAfterCommit(t *testing.T, h Harness, p path) {
	e := newEnv(t, h, pgxinbox.Plain)
	var fired atomic.Bool
	faults := func(_ context.Context, point idem.FaultPoint, ms []idem.Message) error {
		if point == idem.AfterCommit && slices.ContainsFunc(ms, func(m idem.Message) bool { return m.ID == "crash" }) &&
			fired.CompareAndSwap(false, true) {
			return errors.New("process died between commit and ack")
		}
		return nil
	}
	e.publish(msgs("n1", "crash", "n2")...)
	e.start(e.consumer(e.processor(procOptions{faults: faults}), ConsumerOptions{BatchSize: p.batch}))
	e.acked(settle, "n1", "crash", "n2")
	if !fired.Load() {
		t.Fatal("the fault after commit never fired")
	}
	// The crash fails the transaction it hit, a batch as a whole: its
	// first message reports the Retry (in order, the ones after it are
	// not reported), and every copy redelivered meets its marker.
	retried := 0
	for _, id := range []string{"n1", "crash", "n2"} {
		retried += countOf(e.rec.outcomesOf(id), idem.Retry)
	}
	if got := e.rec.outcomesOf("crash"); retried == 0 || !slices.Contains(got, idem.Duplicate) {
		t.Errorf("outcomes of crash: %v, %d Retry in its transaction; want a Retry (the crash) and a Duplicate (the redelivery met its marker)", got, retried)
	}
	e.wantEffects("n1", "crash", "n2")
	e.wantNoDeadLetters()
}

// A consumer that dies at the adapter's own fault point, after the
// database commit and before the ack, leaves the committed messages to
// redelivery, which finds their markers: every message once, some of them
// met again as Duplicates (docs/design.md 4; the incident in docs/design.md).
func crashBeforeAck(t *testing.T, h Harness, p path) {
	e, ids := crashedBeforeAck(t, h, p)
	e.wantEffects(ids...)
	e.wantNoDeadLetters()
}

// The adapter reports a settlement (idembroker.SettleHook) only for what it told
// the broker: after a crash before the ack, the messages of the crashed
// batch are settled once, when their redelivery is acked, not also when
// the crash withheld their ack.
func settledOnce(t *testing.T, h Harness, p path) {
	e, ids := crashedBeforeAck(t, h, p)
	for _, id := range ids {
		if n := e.rec.acks(id); n != 1 {
			t.Errorf("message %s reported acked %d times (outcomes %v); want once: the ack the crash withheld was never sent",
				id, n, e.rec.outcomesOf(id))
		}
	}
}

// crashedBeforeAck runs ten messages through a consumer that crashes once
// at the adapter's fault point before the ack, and another consumer when
// the first one's Run returned, until every message was acked and the
// redelivery of a committed one met its marker.
func crashedBeforeAck(t *testing.T, h Harness, p path) (*env, []string) {
	e := newEnv(t, h, pgxinbox.Plain)
	ids := seq("m", 10)
	e.publish(msgs(ids...)...)
	r := e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{BatchSize: p.batch, CrashBeforeAck: true}))
	restarted := false
	e.waitFor(settle, "every message acked after the crash, a committed one met again as a Duplicate", func() bool {
		if gone, err := r.exited(); gone && !restarted {
			restarted = true
			t.Logf("the consumer crashed: %v", err)
			if err == nil {
				t.Error("Run returned nil after a crash; want the crash's error")
			}
			e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{BatchSize: p.batch}))
		}
		dups := 0
		for _, id := range ids {
			if !e.rec.settled(id) {
				return false
			}
			dups += countOf(e.rec.outcomesOf(id), idem.Duplicate)
		}
		return dups > 0
	})
	return e, ids
}

// A message without an ID goes to the dead-letter destination with a
// reason and is never applied; its neighbours are (docs/design.md 1).
func missingID(t *testing.T, h Harness, p path) {
	e := newEnv(t, h, pgxinbox.Plain)
	body := uniqueBody("no-id")
	e.publish(msg("n1"), Message{Body: []byte(body)}, msg("n2"))
	e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{BatchSize: p.batch}))
	dl := e.deadLetterOf(settle, body)
	e.acked(settle, "n1", "n2")
	// Bad input is refused before any transaction: attempts 0.
	e.wantHeaders(dl, idem.DeadLettered.String(), idem.ErrNoMessageID.Error(), 0)
	if _, byBody := e.effects(); byBody[body] != 0 {
		t.Errorf("the message without an ID was applied %d times; want never", byBody[body])
	}
	e.wantEffects("n1", "n2")
	if n := copiesOf(e.deadLetters(), body); n != 1 {
		t.Errorf("%d dead letters of the message without an ID; want 1", n)
	}
}

// A handler's permanent error dead-letters the message at once, with
// reason, consumer, attempts, outcome and origin; it is never applied,
// each poison message is dead-lettered once, and its neighbours are
// applied (docs/design.md 5, 6, 12).
func poison(t *testing.T, h Harness, p path) {
	e := newEnv(t, h, pgxinbox.Plain)
	fail := func(_ context.Context, m idem.Message, _ int) error {
		if strings.HasPrefix(m.ID, "poison") {
			return idem.Permanent(fmt.Errorf("%s names no such customer", m.ID))
		}
		return nil
	}
	e.publish(msgs("n1", "poison1", "n2", "poison2", "n3")...)
	e.start(e.consumer(e.processor(procOptions{fail: fail}), ConsumerOptions{BatchSize: p.batch}))
	e.acked(settle, "n1", "n2", "n3")
	for _, id := range []string{"poison1", "poison2"} {
		dl := e.deadLetterOf(settle, "body of "+id)
		// x-idem-attempts counts the transactions the message was in, all
		// of which failed: its own, and a shared batch's.
		e.wantHeaders(dl, idem.DeadLettered.String(), id+" names no such customer", e.rec.failedTries(id, false))
		if dl.ID != id {
			t.Errorf("dead letter of %s carries ID %q; want the original's", id, dl.ID)
		}
		if p.batch == 1 {
			if n := e.rec.handlerRuns(id); n != 1 {
				t.Errorf("handler ran %d times for %s, whose error is permanent; want once", n, id)
			}
		}
	}
	e.wantEffects("n1", "n2", "n3")
	e.waitFor(settle, "both poison messages settled", func() bool { return e.rec.deadLetterSettles() >= 2 })
	dls := e.deadLetters()
	for _, id := range []string{"poison1", "poison2"} {
		if n := copiesOf(dls, "body of "+id); n != 1 {
			t.Errorf("%d dead letters of %s; want 1:%s", n, id, describe(dls))
		}
	}
	if len(dls) != 2 {
		t.Errorf("%d dead letters; want 2:%s", len(dls), describe(dls))
	}
}

// A handler error that is not permanent is retried, and the message is
// dead-lettered after exactly RetryPolicy.MaxAttempts runs of the handler,
// counting the run in a shared batch transaction it failed, with
// x-idem-attempts saying so (docs/design.md 5, 11).
func transientExhausted(t *testing.T, h Harness, p path) {
	e := newEnv(t, h, pgxinbox.Plain)
	fail := func(_ context.Context, m idem.Message, _ int) error {
		if m.ID == "flaky" {
			return errors.New("payment gateway timed out")
		}
		return nil
	}
	e.publish(msgs("n1", "flaky", "n2")...)
	e.start(e.consumer(e.processor(procOptions{fail: fail}), ConsumerOptions{BatchSize: p.batch}))
	dl := e.deadLetterOf(settle, "body of flaky")
	e.acked(settle, "n1", "n2")
	all := e.rec.failedTries("flaky", false)
	if all != maxAttempts {
		t.Errorf("flaky was in %d failed transactions; want RetryPolicy.MaxAttempts = %d, a batch's shared one included", all, maxAttempts)
	}
	if runs := e.rec.handlerRuns("flaky"); runs != maxAttempts {
		t.Errorf("the handler ran %d times for flaky; want RetryPolicy.MaxAttempts = %d", runs, maxAttempts)
	}
	e.wantHeaders(dl, idem.DeadLettered.String(), idem.ErrRetriesExhausted.Error(), all)
	if !strings.Contains(dl.Headers[idembroker.HeaderReason], "payment gateway timed out") {
		t.Errorf("%s = %q; want the handler's error in it", idembroker.HeaderReason, dl.Headers[idembroker.HeaderReason])
	}
	e.wantEffects("n1", "n2")
	if n := copiesOf(e.deadLetters(), "body of flaky"); n != 1 {
		t.Errorf("%d dead letters of flaky; want 1", n)
	}
}

// A message older than the inbox's retention window (its event-time
// header 20 days old, the window 14) cannot be proven new: Expired, to the
// dead-letter destination with outcome expired, never applied (docs/design.md
// 8).
func expired(t *testing.T, h Harness) {
	e := newEnv(t, h, pgxinbox.Plain)
	old := time.Now().Add(-20 * 24 * time.Hour)
	e.publish(msg("n1"), Message{ID: "old", Body: []byte("body of old"), EventTime: old, Timestamp: old}, msg("n2"))
	e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{}))
	dl := e.deadLetterOf(settle, "body of old")
	e.acked(settle, "n1", "n2")
	e.wantHeaders(dl, idem.Expired.String(), idem.ErrExpired.Error(), 0)
	e.wantEffects("n1", "n2")
}

// Two consumers of one topic, each with its own processor and pool, and
// every message published twice: each is applied once, whichever consumer
// got which copy and however their transactions raced (docs/design.md 3).
func twoConsumers(t *testing.T, h Harness) {
	e := newEnv(t, h, pgxinbox.Plain)
	ids := seq("m", 30)
	var copies []Message
	for _, id := range ids {
		copies = append(copies, msg(id), msg(id))
	}
	e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{BatchSize: 5}))
	e.start(e.consumer(e.processor(procOptions{store: e.store(e.openPool(e.url), false)}), ConsumerOptions{BatchSize: 5}))
	e.publish(copies...)
	e.waitFor(settle, "every copy acked", func() bool {
		for _, id := range ids {
			if e.rec.acks(id) < 2 {
				return false
			}
		}
		return true
	})
	e.wantEffects(ids...)
	e.wantNoDeadLetters()
}

// An outage of the inbox database made the real way (a proxy that stops
// answering or goes silent, with connect_timeout=1), between messages,
// under a handler or under a COMMIT, spends no message's budget: messages
// are held past RetryPolicy.WaitUnavailable, nothing is dead-lettered, and
// everything is applied once after the database comes back (docs/design.md 4,
// 11).
func outage(t *testing.T, h Harness, fail func(*netfault.Proxy), at strike) {
	e := newEnv(t, h, pgxinbox.Plain)
	pool, proxy := e.proxiedPool()
	ids := seq("during", 4)
	// The first message under way waits at its strike point until the
	// outage began, then goes on into it.
	reached, struck := make(chan struct{}), make(chan struct{})
	var first sync.Once
	hold := func(ctx context.Context) {
		first.Do(func() {
			close(reached)
			select {
			case <-struck:
			case <-ctx.Done():
			case <-time.After(settle):
			}
		})
	}
	o := procOptions{store: e.store(pool, false)}
	o.fail = func(ctx context.Context, m idem.Message, _ int) error {
		if at == underHandler && m.ID == ids[0] {
			hold(ctx)
		}
		return nil
	}
	o.faults = func(ctx context.Context, point idem.FaultPoint, ms []idem.Message) error {
		if at == underCommit && point == idem.AfterHandler && slices.ContainsFunc(ms, func(m idem.Message) bool { return m.ID == ids[0] }) {
			hold(ctx)
		}
		return nil
	}
	e.start(e.consumer(e.processor(o), ConsumerOptions{}))
	e.publish(msg("before"))
	e.acked(settle, "before")
	tries := len(e.rec.failures())
	if at == betweenMessages {
		fail(proxy)
		e.publish(msgs(ids...)...)
	} else {
		e.publish(msgs(ids...)...)
		select {
		case <-reached:
		case <-time.After(settle):
			t.Fatalf("no transaction reached the point the outage strikes at\n%s", e.rec.summary())
		}
		fail(proxy)
		close(struck)
	}
	// Two blameless Retries: the adapter held a message and came back to
	// it while the outage went on.
	e.waitFor(settle, "messages held through the outage (failed tries, then blameless Retries past WaitUnavailable, twice)", func() bool {
		return len(e.rec.failures()) >= tries+3 && e.rec.blamelessRetries() >= 2
	})
	proxy.Restore()
	e.acked(settle, ids...)
	t.Logf("during the outage: %s", e.rec.triesSince(tries))
	e.wantEffects(append(ids, "before")...)
	e.wantNoDeadLetters()
}

// strike is where in a transaction an outage begins.
type strike int

const (
	betweenMessages strike = iota // no transaction open
	underHandler                  // the handler's statement meets it
	underCommit                   // COMMIT meets it
)

// Run refuses to start when the inbox table is missing, with an error
// wrapping idem.ErrInboxNotReady, and takes nothing: a consumer started
// after the migration applies every message once (docs/design.md 11).
func missingInboxTable(t *testing.T, h Harness) {
	e := newEnv(t, h, pgxinbox.Plain)
	bare := e.store(e.pool, true)
	e.publish(msg("m1"))
	err := e.refused(e.consumer(e.processor(procOptions{store: bare}), ConsumerOptions{}), settle)
	if !errors.Is(err, idem.ErrInboxNotReady) {
		t.Fatalf("Run = %v; want an error wrapping idem.ErrInboxNotReady", err)
	}
	t.Logf("Run refused: %v", err)
	if n := e.rec.handlerRuns("m1"); n != 0 {
		t.Errorf("a consumer that refused to start ran the handler %d times", n)
	}
	if err := bare.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.start(e.consumer(e.processor(procOptions{store: bare}), ConsumerOptions{}))
	e.acked(settle, "m1")
	e.wantEffects("m1")
	e.wantNoDeadLetters()
}

// An inbox table that goes away under a running consumer (a deploy ahead
// of its migration, a table renamed) is a configuration outage: messages
// are held, nothing is dead-lettered, and all are applied once when the
// table is back (docs/design.md 11).
func inboxTableGone(t *testing.T, h Harness) {
	e := newEnv(t, h, pgxinbox.Plain)
	e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{}))
	e.publish(msg("before"))
	e.acked(settle, "before")
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `ALTER TABLE idem_inbox RENAME TO idem_inbox_away`); err != nil {
		t.Fatal(err)
	}
	ids := seq("during", 3)
	e.publish(msgs(ids...)...)
	e.waitFor(settle, "messages held while the inbox table is gone (a configuration error, then a blameless Retry)", func() bool {
		return e.rec.failedOfClass(idemstore.ClassConfig) >= 2 && e.rec.blamelessRetries() >= 1
	})
	if _, err := e.pool.Exec(ctx, `ALTER TABLE idem_inbox_away RENAME TO idem_inbox`); err != nil {
		t.Fatal(err)
	}
	e.acked(settle, ids...)
	e.wantEffects(append(ids, "before")...)
	e.wantNoDeadLetters()
}

// Cancelling Run while the inbox database is unreachable returns within
// the harness's StopWithin, dead-letters nothing, and leaves every
// message to a later consumer, which applies each once (docs/design.md 4, 11).
func shutdownDuringOutage(t *testing.T, h Harness) {
	e := newEnv(t, h, pgxinbox.Plain)
	pool, proxy := e.proxiedPool()
	r := e.start(e.consumer(e.processor(procOptions{store: e.store(pool, false)}), ConsumerOptions{}))
	e.publish(msg("before"))
	e.acked(settle, "before")
	tries := len(e.rec.failures())
	proxy.Stop()
	ids := seq("during", 3)
	e.publish(msgs(ids...)...)
	e.waitFor(settle, "tries failing against the outage", func() bool { return len(e.rec.failures()) >= tries+2 })
	if err := r.stop(); err != nil {
		t.Errorf("Run = %v after a shutdown; want nil", err)
	}
	e.wantNoDeadLetters()
	proxy.Restore()
	e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{}))
	e.acked(settle, ids...)
	e.wantEffects(append(ids, "before")...)
	e.wantNoDeadLetters()
}

// A consumer started while the inbox database is unreachable (a connect
// that times out) waits for it: an outage is not a reason to refuse to
// start, as a missing table is. Once the database is back, it applies
// what waited (docs/design.md 11).
func outageAtStart(t *testing.T, h Harness) {
	e := newEnv(t, h, pgxinbox.Plain)
	pool, proxy := e.proxiedPool()
	proc := e.processor(procOptions{store: e.store(pool, false)})
	e.publish(msg("m1"))
	proxy.Stop()
	base := proxy.Accepted()
	r := e.start(e.consumer(proc, ConsumerOptions{}))
	// Each try is a connection the proxy accepts and never answers, given
	// up after connect_timeout=1: three of them mean a try timed out and
	// the consumer went on trying.
	e.waitFor(settle, "the consumer trying the database three times, or Run returning", func() bool {
		gone, _ := r.exited()
		return gone || proxy.Accepted() >= base+3
	})
	if gone, err := r.exited(); gone {
		t.Fatalf("Run = %v while the inbox database was unreachable at start; want it to wait for the database", err)
	}
	proxy.Restore()
	e.acked(settle, "m1")
	e.wantEffects("m1")
	e.wantNoDeadLetters()
}

// A consumer whose dead letters would have nowhere to go refuses to start
// and takes nothing (docs/design.md 12).
func noDeadLetterDestination(t *testing.T, h Harness) {
	e := newEnv(t, h, pgxinbox.Plain)
	e.publish(msg("m1"))
	err := e.refused(e.consumer(e.processor(procOptions{}), ConsumerOptions{NoDeadLetterDestination: true}), settle)
	if want := h.Features().ErrNoDeadLetterDestination; want != nil && !errors.Is(err, want) {
		t.Fatalf("Run = %v; want an error wrapping %v", err, want)
	}
	t.Logf("Run refused: %v", err)
	if n := e.rec.handlerRuns("m1"); n != 0 {
		t.Errorf("a consumer that refused to start ran the handler %d times", n)
	}
	e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{}))
	e.acked(settle, "m1")
	e.wantEffects("m1")
	e.wantNoDeadLetters()
}

// A dead-letter destination that goes away under a running consumer
// loses no dead letter and doubles none: the poison messages stay with
// the consumer, unsettled, while their dead letters cannot be written,
// and reach the destination once each when it is back (docs/design.md 12).
func deadLetterDestinationLost(t *testing.T, h Harness) {
	b, ok := h.(DeadLetterBreaker)
	if !ok {
		t.Skip("the harness cannot take a dead-letter destination away (it is no DeadLetterBreaker)")
	}
	e := newEnv(t, h, pgxinbox.Plain)
	fail := func(_ context.Context, m idem.Message, _ int) error {
		if strings.HasPrefix(m.ID, "poison") {
			return idem.Permanent(fmt.Errorf("%s names no such customer", m.ID))
		}
		return nil
	}
	e.start(e.consumer(e.processor(procOptions{fail: fail}), ConsumerOptions{}))
	e.publish(msg("before"))
	e.acked(settle, "before")
	b.DropDeadLetters(t, e.topic)
	e.publish(msgs("poison1", "poison2", "n1")...)
	e.waitFor(settle, "dead letters failing to be written, twice", func() bool { return e.rec.deadLetterFailures() >= 2 })
	if n := e.rec.deadLetterSettles(); n != 0 {
		t.Errorf("%d messages settled as dead letters while no dead letter could be written", n)
	}
	b.RestoreDeadLetters(t, e.topic)
	e.acked(settle, "n1")
	e.waitFor(settle, "both poison messages settled as dead letters", func() bool { return e.rec.deadLetterSettles() >= 2 })
	dls := e.deadLetters()
	for _, id := range []string{"poison1", "poison2"} {
		if n := copiesOf(dls, "body of "+id); n != 1 {
			t.Errorf("%d dead letters of %s; want 1:%s", n, id, describe(dls))
		}
	}
	if len(dls) != 2 {
		t.Errorf("%d dead letters; want 2:%s", len(dls), describe(dls))
	}
	e.wantEffects("before", "n1")
}

// Where the broker promises order, messages are applied in the order they
// were published, with a transient failure retried and a poison message
// dead-lettered in the middle (docs/design.md 6).
func ordered(t *testing.T, h Harness, p path) {
	if !h.Features().Ordered {
		t.Skip("the broker promises no order (Features.Ordered is false)")
	}
	e := newEnv(t, h, pgxinbox.Plain)
	ids := seq("m", 40)
	poisoned := ids[25]
	fail := func(_ context.Context, m idem.Message, run int) error {
		switch {
		case m.ID == ids[12] && run == 1:
			return errors.New("deadlock detected, once")
		case m.ID == poisoned:
			return idem.Permanent(errors.New("no such customer"))
		}
		return nil
	}
	e.publish(msgs(ids[:20]...)...)
	e.start(e.consumer(e.processor(procOptions{fail: fail}), ConsumerOptions{BatchSize: p.batch}))
	e.publish(msgs(ids[20:]...)...)
	want := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == poisoned })
	e.acked(settle, want...)
	e.deadLetterOf(settle, "body of "+poisoned)
	if got := e.order(); !slices.Equal(got, want) {
		t.Errorf("applied in the order\n  %v\nwant the order published, without the dead letter\n  %v", got, want)
	}
}

// On the partitioned inbox, the same UUIDv7 ID republished with other
// timestamps (event-time header and broker timestamp a second later, a
// day earlier) meets its marker whether it comes in the same batch or
// long after: one effect. A message whose ID carries no time cannot be
// placed and is dead-lettered, one whose ID's time is older than the
// window expires; neither is applied (docs/design.md 7, 8; issue 11).
func partitionedRepublish(t *testing.T, h Harness, p path) {
	e := newEnv(t, h, pgxinbox.Partitioned)
	now := time.Now().UTC()
	x, y := UUIDv7(now.Add(-time.Minute)), UUIDv7(now.Add(-2*time.Minute))
	at := func(id string, ts time.Time) Message {
		return Message{ID: id, Body: []byte("body of " + id), EventTime: ts, Timestamp: ts}
	}
	e.start(e.consumer(e.processor(procOptions{}), ConsumerOptions{BatchSize: p.batch}))
	// y twice back to back: one batch on the batch path.
	e.publish(at(x, now.Add(-time.Minute)), at(y, now.Add(-2*time.Minute)), at(y, now.Add(-2*time.Minute+time.Second)))
	e.waitFor(settle, "x acked, y acked twice", func() bool { return e.rec.acks(x) >= 1 && e.rec.acks(y) >= 2 })
	// x again, after its first copy committed: a publisher whose confirm
	// timed out republishes a second later, and a replay restamps it a
	// day earlier.
	e.publish(at(x, now.Add(-time.Minute+time.Second)))
	e.waitFor(settle, "x republished a second later acked", func() bool { return e.rec.acks(x) >= 2 })
	e.publish(at(x, now.Add(-25*time.Hour)))
	e.waitFor(settle, "x restamped a day earlier acked", func() bool { return e.rec.acks(x) >= 3 })
	for id, n := range map[string]int{x: 2, y: 1} {
		if got := e.rec.outcomesOf(id); countOf(got, idem.Applied) != 1 || countOf(got, idem.Duplicate) != n {
			t.Errorf("outcomes of %s: %v; want one Applied and %d Duplicates", id, got, n)
		}
	}
	e.wantEffects(x, y)
	e.wantNoDeadLetters()

	untimed, old := "order-17", UUIDv7(now.Add(-72*time.Hour))
	e.publish(msg(untimed), msg(old))
	dl := e.deadLetterOf(settle, "body of "+untimed)
	e.wantHeaders(dl, idem.DeadLettered.String(), "no partition time", 0)
	// Older than the 48h window by its ID's time: its day may be dropped.
	dl = e.deadLetterOf(settle, "body of "+old)
	e.wantHeaders(dl, idem.Expired.String(), idem.ErrExpired.Error(), 0)
	e.wantEffects(x, y)
}

// A consumer whose broker connection is cut while a batch is in the
// database loses nothing and doubles nothing: what committed is found in
// the inbox when the broker redelivers it (the incident in docs/design.md).
func connectionCut(t *testing.T, h Harness) {
	e := newEnv(t, h, pgxinbox.Plain)
	ids := seq("m", 20)
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fail := func(ctx context.Context, m idem.Message, run int) error {
		if m.ID == ids[5] && run == 1 {
			once.Do(func() { close(reached) })
			select {
			case <-release:
			case <-ctx.Done():
			case <-time.After(settle):
			}
		}
		return nil
	}
	c := e.consumer(e.processor(procOptions{fail: fail}), ConsumerOptions{})
	cut, ok := c.(Cutter)
	if !ok {
		t.Skip("the harness cannot cut the consumer's broker connection (its Consumer is no Cutter)")
	}
	e.publish(msgs(ids...)...)
	e.start(c)
	select {
	case <-reached:
	case <-time.After(settle):
		t.Fatalf("the handler never reached %s\n%s", ids[5], e.rec.summary())
	}
	if !cut.Cut() {
		t.Fatal("Cut found no connection to cut")
	}
	close(release)
	e.acked(settle, ids...)
	e.wantEffects(ids...)
	e.wantNoDeadLetters()
}
