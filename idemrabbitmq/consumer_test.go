package idemrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/netfault"
)

// The incident of seed 003: a broker restart requeued 3,100 unacked
// messages and the consumer applied them again. Here the consumer commits
// a part of them, the connection is cut with those acks withheld, and later
// cut again from the broker's side; the consumer reconnects by itself.
func TestIncidentRedeliveryAfterCut(t *testing.T) {
	t.Parallel()
	const n = 3100
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	publish(t, conn, topo.Queue, 0, n, msgID)

	cfg := config(t, topo.Queue)
	var processed atomic.Int64
	var withheld, secondCut atomic.Bool
	cutNow, cutDone := make(chan struct{}), make(chan struct{})
	cfg.Faults = func(ctx context.Context, p idem.FaultPoint, msgs []idem.Message) error {
		total := processed.Add(int64(len(msgs)))
		// Once ~1,000 messages committed, withhold one batch's acks and cut
		// the connection: exactly a restart between commit and ack.
		if total >= 1000 && withheld.CompareAndSwap(false, true) {
			return errors.New("drill: broker restart before ack")
		}
		// At ~2,000, hold a committed batch while the broker itself closes
		// the connection; its acks then have nowhere to go.
		if total >= 2000 && secondCut.CompareAndSwap(false, true) {
			close(cutNow)
			<-cutDone
		}
		return nil
	}
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)

	select {
	case <-cutNow:
	case <-time.After(60 * time.Second):
		t.Fatal("the stream never reached 2,000 messages")
	}
	how := "rabbitmqctl close_connection"
	if !closeByName(t, cfg.ConnectionName) {
		// No rabbitmqctl here: cut at the socket instead.
		how = "DropConnection"
		if !c.DropConnection() {
			t.Error("no connection to drop while a batch was held")
		}
	}
	close(cutDone)
	t.Logf("second cut by %s", how)
	rec.waitUntil(t, 60*time.Second, "every message acked", func() bool { return rec.distinctAcked() == n })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	rows, distinct := d.effects(t)
	st := c.Stats()
	t.Logf("effects %d, stats %+v", rows, st)
	if rows != n || distinct != n {
		t.Fatalf("effects: %d rows, %d distinct; want exactly %d", rows, distinct, n)
	}
	if !withheld.Load() {
		t.Fatal("the drill never withheld acks")
	}
	if st.Duplicates == 0 || st.Redelivered == 0 {
		t.Fatalf("no redelivered duplicates counted (%+v): the cut did not cause the incident's redelivery", st)
	}
	if st.Reconnects < 2 {
		t.Fatalf("reconnects = %d, want at least 2 (two cuts)", st.Reconnects)
	}
	if q := depth(t, conn, topo.Queue); q != 0 {
		t.Fatalf("queue holds %d messages, want 0", q)
	}
	if dl := drain(t, conn, topo.DeadLetterQueue); len(dl) != 0 {
		t.Fatalf("%d messages dead-lettered, want 0", len(dl))
	}
}

// Two publishes of one message_id, neither flagged redelivered: the flag
// cannot help, the inbox must.
func TestSameMessageIDTwiceAppliesOnce(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	publish(t, conn, topo.Queue, 0, 1, msgID)
	publish(t, conn, topo.Queue, 0, 1, msgID)

	cfg := config(t, topo.Queue)
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	rec.waitUntil(t, 30*time.Second, "both deliveries acked", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.acked[msgID(0)] == 2
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, _ := d.effects(t); rows != 1 {
		t.Fatalf("effects = %d, want 1", rows)
	}
	st := c.Stats()
	if st.Applied != 1 || st.Duplicates != 1 || st.Redelivered != 0 {
		t.Fatalf("stats %+v, want 1 applied, 1 duplicate, 0 redelivered", st)
	}
	if q := depth(t, conn, topo.Queue); q != 0 {
		t.Fatalf("queue holds %d", q)
	}
}

// poisonHandler fails permanently on one message and panics on another.
func poisonHandler(ctx context.Context, tx pgx.Tx, m idem.Message) error {
	switch m.ID {
	case msgID(10):
		return idem.Permanent(errors.New("customer cus-10 does not exist"))
	case msgID(20):
		panic("nil invoice template")
	}
	return write(ctx, tx, m)
}

func TestPoisonMessageGoesToDLQWithReason(t *testing.T) {
	t.Parallel()
	const n = 300
	for _, viaExchange := range []bool{false, true} {
		t.Run(fmt.Sprintf("exchange=%v", viaExchange), func(t *testing.T) {
			t.Parallel()
			conn := broker(t)
			topo := topology(t, conn, nil)
			d := newDB(t, uniqueName(t))
			publish(t, conn, topo.Queue, 0, n, msgID)

			cfg := config(t, topo.Queue)
			cfg.BatchSize = 50
			if viaExchange {
				cfg.DeadLetterExchange = topo.DeadLetterExchange
			}
			rec := newSettlements()
			cfg.Hooks = []idem.Hook{rec}
			c, err := idemrabbitmq.NewConsumer(d.processor(t, poisonHandler), cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			rec.waitUntil(t, 30*time.Second, "the stream to flow past the poison", func() bool {
				return rec.distinctAcked() == n-2 && rec.deadLettered() == 2
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if rows, distinct := d.effects(t); rows != n-2 || distinct != n-2 {
				t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n-2)
			}
			if st := c.Stats(); st.Requeued != 0 || st.DeadLettered != 2 {
				t.Fatalf("stats %+v: poison must be dead-lettered, never requeued", st)
			}
			if q := depth(t, conn, topo.Queue); q != 0 {
				t.Fatalf("queue holds %d", q)
			}
			var dead []amqp.Delivery
			poll(t, 10*time.Second, "the DLQ to hold both", func() bool {
				dead = append(dead, drain(t, conn, topo.DeadLetterQueue)...)
				return len(dead) >= 2
			})
			reasons := map[string]string{}
			for _, m := range dead {
				reasons[m.MessageId], _ = m.Headers[idembroker.HeaderReason].(string)
				if m.Headers[idembroker.HeaderConsumer] != "billing-invoice" || m.Headers[idembroker.HeaderOrigin] != topo.Queue ||
					m.Headers[idembroker.HeaderOutcome] != "dead_lettered" || m.Headers[idembroker.HeaderAttempts] == nil {
					t.Errorf("dead letter headers %v", m.Headers)
				}
			}
			if len(dead) != 2 {
				t.Errorf("%d dead letters in the DLQ, want exactly 2", len(dead))
			}
			want := map[string]string{msgID(10): "cus-10 does not exist", msgID(20): "panicked"}
			for id, w := range want {
				if !strings.Contains(reasons[id], w) {
					t.Errorf("dead letter %s: reason %q, want it to mention %q", id, reasons[id], w)
				}
			}
		})
	}
}

func TestMissingMessageIDIsDeadLettered(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The raw channel: the Publisher helper refuses a message without ID.
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, m := range []amqp.Publishing{
		{Body: []byte("no identity")},
		{MessageId: "has-id", Body: []byte("fine")},
	} {
		c, err := ch.PublishWithDeferredConfirm("", topo.Queue, false, false, m)
		if err != nil || !c.Wait() {
			t.Fatalf("publishing: %v", err)
		}
	}
	pub, err := idemrabbitmq.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), "", topo.Queue, amqp.Publishing{Body: []byte("x")}); !errors.Is(err, idemrabbitmq.ErrNoMessageID) {
		t.Fatalf("Publisher without message_id: %v, want ErrNoMessageID", err)
	}
	cfg := config(t, topo.Queue)
	cfg.DeadLetterExchange = topo.DeadLetterExchange
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	rec.waitUntil(t, 30*time.Second, "both settled", func() bool { return rec.distinctAcked() == 1 && rec.deadLettered() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, _ := d.effects(t); rows != 1 {
		t.Fatalf("effects = %d, want only the message with an ID", rows)
	}
	var dead []amqp.Delivery
	poll(t, 10*time.Second, "the DLQ", func() bool {
		dead = append(dead, drain(t, conn, topo.DeadLetterQueue)...)
		return len(dead) > 0
	})
	if reason, _ := dead[0].Headers[idembroker.HeaderReason].(string); string(dead[0].Body) != "no identity" || !strings.Contains(reason, idem.ErrNoMessageID.Error()) {
		t.Fatalf("dead letter %q with reason %q", dead[0].Body, reason)
	}
}

// PostgreSQL connections killed under the consumer: nothing may be acked
// before its commit, and nothing may be lost.
func TestTerminatedBackendsNeverAckWithoutCommit(t *testing.T) {
	t.Parallel()
	const n = 1500
	conn := broker(t)
	topo := topology(t, conn, nil)
	app := "idemrabbitmq-" + randomHex(4) // application_name is cut at 63 bytes
	d := newDB(t, app)
	// The checks run on their own pool, one the terminations spare.
	checkURL, err := url.Parse(d.url)
	if err != nil {
		t.Fatal(err)
	}
	q := checkURL.Query()
	q.Set("application_name", app+"-check")
	checkURL.RawQuery = q.Encode()
	check, err := pgxpool.New(context.Background(), checkURL.String())
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	publish(t, conn, topo.Queue, 0, n, msgID)

	cfg := config(t, topo.Queue)
	cfg.BatchSize = 50
	rec := newSettlements()
	var violations atomic.Int64
	var firstViolation atomic.Value
	// Runs in the consumer's loop right after each ack frame: the effect
	// must already be committed and visible to another connection.
	rec.onAck = func(r idem.Result) {
		var ok bool
		err := check.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM effects WHERE key = $1)`, r.MessageID).Scan(&ok)
		if err == nil && !ok {
			violations.Add(1)
			firstViolation.CompareAndSwap(nil, r.MessageID)
		}
	}
	cfg.Hooks = []idem.Hook{rec}
	terminate := func() int64 {
		var k int64
		if err := check.QueryRow(context.Background(),
			`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&k); err != nil {
			return 0
		}
		return k
	}
	var killed, calls atomic.Int64
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil, func(c *idem.Config[pgx.Tx]) {
		c.Retry = idem.RetryPolicy{MaxAttempts: 3, Backoff: idem.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}}
		// Every seventh transaction loses its connection after the effect
		// was written and before COMMIT: the classic "acked without
		// commit" trap.
		c.Faults = func(ctx context.Context, p idem.FaultPoint, _ []idem.Message) error {
			if p == idem.AfterHandler && calls.Add(1)%7 == 0 {
				killed.Add(terminate())
			}
			return nil
		}
	}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	// Terminate the consumer's backends over and over while the stream
	// flows, so that some die mid-transaction and some mid-commit.
	rec.waitUntil(t, 60*time.Second, "100 acked", func() bool { return rec.distinctAcked() >= 100 })
	killerDone := make(chan struct{})
	stopKiller := make(chan struct{})
	go func() {
		defer close(killerDone)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		// Kill again only once something was acked since the last kill: as
		// often as the consumer can make progress, however loaded the
		// machine (a fixed rate can kill connections faster than a slow
		// machine opens them, and then nothing is left to test).
		last := -1
		for {
			select {
			case <-stopKiller:
				return
			case <-tick.C:
			}
			if acked := rec.distinctAcked(); acked > last {
				last = acked
				killed.Add(terminate())
			}
		}
	}()
	rec.waitUntil(t, 60*time.Second, "1,200 acked under fire", func() bool { return rec.distinctAcked() >= 1200 })
	close(stopKiller)
	<-killerDone
	rec.waitUntil(t, 60*time.Second, "every message settled", func() bool { return rec.distinctAcked()+rec.deadLettered() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("terminated %d backends; stats %+v", killed.Load(), c.Stats())
	// A terminated backend is an outage, never the message's fault.
	if dl := drain(t, conn, topo.DeadLetterQueue); len(dl) != 0 {
		t.Errorf("%d healthy messages dead-lettered; first %s: %v", len(dl), dl[0].MessageId, dl[0].Headers[idembroker.HeaderReason])
	}
	if killed.Load() == 0 {
		t.Fatal("no backend was terminated: the test proved nothing")
	}
	if v := violations.Load(); v > 0 {
		t.Fatalf("%d acks were sent before their effect committed (first: %v)", v, firstViolation.Load())
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
	if q := depth(t, conn, topo.Queue); q != 0 {
		t.Fatalf("queue holds %d", q)
	}
}

// Two consumers share a queue in which every message was published twice:
// each key takes effect once and the overlapping batches never deadlock.
func TestTwoConsumersDuplicatedMessages(t *testing.T) {
	t.Parallel()
	const n = 1000
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	publish(t, conn, topo.Queue, 0, n, msgID)
	publish(t, conn, topo.Queue, 0, n, msgID)

	rec := newSettlements()
	var consumers []*idemrabbitmq.Consumer[pgx.Tx]
	var stops []func() error
	for range 2 {
		cfg := config(t, topo.Queue)
		cfg.BatchSize, cfg.Prefetch, cfg.Workers = 50, 200, 2
		cfg.Hooks = []idem.Hook{rec}
		c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, c)
		stops = append(stops, run(t, c))
	}
	rec.waitUntil(t, 60*time.Second, "every delivery acked", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		total := 0
		for _, k := range rec.acked {
			total += k
		}
		return total == 2*n
	})
	var sum idemrabbitmq.Stats
	for i, stop := range stops {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		st := consumers[i].Stats()
		if st.Delivered == 0 {
			t.Errorf("consumer %d received nothing: the test did not share the queue", i)
		}
		sum.Applied += st.Applied
		sum.Duplicates += st.Duplicates
		sum.Requeued += st.Requeued
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
	if sum.Applied != n || sum.Duplicates != n || sum.Requeued != 0 {
		t.Fatalf("applied %d, duplicates %d, requeued %d; want %d, %d, 0 (a deadlock or lock timeout requeues)", sum.Applied, sum.Duplicates, sum.Requeued, n, n)
	}
}

func TestRunRefusesMissingQueue(t *testing.T) {
	t.Parallel()
	broker(t) // fail with the fix when the broker is down
	d := newDB(t, uniqueName(t))
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), config(t, uniqueName(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatalf("Run = %v, want a 404 NOT_FOUND error", err)
	}
}

// Cancelling Run mid-stream acks what committed and leaves the rest in the
// queue, and the consumer can run again to finish.
func TestGracefulShutdownAndResume(t *testing.T) {
	t.Parallel()
	const n = 2000
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	publish(t, conn, topo.Queue, 0, n, msgID)
	cfg := config(t, topo.Queue)
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	rec.waitUntil(t, 30*time.Second, "300 acked", func() bool { return rec.distinctAcked() >= 300 })
	if err := stop(); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	acked := rec.distinctAcked()
	rows, _ := d.effects(t)
	// The broker requeues the deliveries that were in flight when the
	// channel closed on its own time: wait for the queue to settle.
	var q int
	poll(t, 10*time.Second, "the in-flight deliveries to return to the queue", func() bool {
		q = depth(t, conn, topo.Queue)
		return q >= n-acked
	})
	if rows != acked || q != n-acked {
		t.Fatalf("after shutdown: %d effects, %d acked, %d in the queue; want effects = acked and the rest (%d) queued", rows, acked, q, n-acked)
	}
	stop = run(t, c)
	rec.waitUntil(t, 30*time.Second, "the rest acked", func() bool { return rec.distinctAcked() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
}

// A message that keeps failing transiently sits FIRST in a batch of healthy
// ones on a quorum queue with a low delivery limit. The processor retries
// it in place up to its MaxAttempts and dead-letters it; the healthy
// messages are never requeued with it (each requeue would raise their
// x-delivery-count): they are applied on the first delivery, and only the
// failing message reaches the dead-letter queue.
func TestFailingMessageFirstDoesNotSinkItsNeighbours(t *testing.T) {
	t.Parallel()
	const healthy = 20
	conn := broker(t)
	topo := topology(t, conn, &idemrabbitmq.TopologyOptions{DeliveryLimit: 3})
	d := newDB(t, uniqueName(t))
	// The failing message is published first, then its neighbours, so that
	// all of them share its batch.
	publish(t, conn, topo.Queue, 0, 1+healthy, msgID)

	var failures atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if m.ID == msgID(0) {
			failures.Add(1)
			return errors.New("tax service timed out")
		}
		return write(ctx, tx, m)
	}
	cfg := config(t, topo.Queue)
	cfg.BatchWait = 200 * time.Millisecond // one batch for the whole lot
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, h, func(c *idem.Config[pgx.Tx]) {
		c.Retry = idem.RetryPolicy{MaxAttempts: 3, Backoff: idem.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}}
	}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	var dead []amqp.Delivery
	poll(t, 30*time.Second, "the consumer to dead-letter the failing message", func() bool {
		dead = append(dead, drain(t, conn, topo.DeadLetterQueue)...)
		return len(dead) > 0
	})
	rec.waitUntil(t, 30*time.Second, "every healthy message acked", func() bool { return rec.distinctAcked() == healthy })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Anything else dead-lettered would have arrived with the failing one.
	dead = append(dead, drain(t, conn, topo.DeadLetterQueue)...)
	if len(dead) != 1 || dead[0].MessageId != msgID(0) {
		ids := make([]string, len(dead))
		for i := range dead {
			ids[i] = dead[i].MessageId
		}
		t.Fatalf("dead-lettered %v, want only %s", ids, msgID(0))
	}
	t.Logf("x-idem-attempts %v", dead[0].Headers[idembroker.HeaderAttempts])
	if rows, distinct := d.effects(t); rows != healthy || distinct != healthy {
		t.Fatalf("effects %d (%d distinct), want the %d healthy messages once each", rows, distinct, healthy)
	}
	var firstTry int
	if err := d.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE attempt = 1`).Scan(&firstTry); err != nil {
		t.Fatal(err)
	}
	if firstTry != healthy {
		t.Fatalf("%d of %d healthy messages applied on their first delivery: the failing one dragged the rest into requeues", firstTry, healthy)
	}
	st := c.Stats()
	t.Logf("failures %d; stats %+v", failures.Load(), st)
	// MaxAttempts runs in all, the batch's shared transaction that it
	// failed included.
	if failures.Load() != 3 {
		t.Fatalf("the failing message ran %d times, want the processor's MaxAttempts, 3, the batch's run included", failures.Load())
	}
	if st.Requeued != 0 {
		t.Fatalf("stats %+v: nothing may be requeued", st)
	}
	if q := depth(t, conn, topo.Queue); q != 0 {
		t.Fatalf("queue holds %d", q)
	}
}

// observerFunc is an idem.OutcomeHook from a function.
type observerFunc func(idem.Result)

func (f observerFunc) OnOutcome(_ string, r idem.Result, _ time.Duration) { f(r) }

// outageCounter observes the processor: how many results were a Retry
// because the database stayed unreachable.
type outageCounter struct{ unavailable atomic.Int64 }

func (o *outageCounter) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	if r.Outcome == idem.Retry && errors.Is(r.Err, idem.ErrUnavailable) {
		o.unavailable.Add(1)
	}
}

// outageProcessor is the billing processor on a pool that reaches the
// database through a proxy the test can cut, waiting waitUnavailable for
// the database before each Retry.
func outageProcessor(t *testing.T, d *db, waitUnavailable time.Duration, obs idem.OutcomeHook) (*idem.Processor[pgx.Tx], *netfault.Proxy) {
	t.Helper()
	pool, proxy := d.poolVia(t)
	return d.processorOn(t, pool, nil, func(c *idem.Config[pgx.Tx]) {
		c.Retry = idem.RetryPolicy{MaxAttempts: 3, Backoff: idem.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}, WaitUnavailable: waitUnavailable}
		c.Hooks = append(c.Hooks, obs)
	}), proxy
}

// The database goes away mid-stream for longer than the processor waits for
// it, again and again. On a quorum queue with a delivery limit of 2, nacking
// those Retry outcomes would dead-letter healthy messages within seconds;
// the consumer holds them instead, pauses intake, and processes them again
// when the database is back: nothing is dead-lettered, at most the batches
// whose COMMIT the cut caught are requeued once, and every message is
// applied once.
func TestDatabaseOutageSpendsNoDeliveries(t *testing.T) {
	t.Parallel()
	const n = 400
	conn := broker(t)
	topo := topology(t, conn, &idemrabbitmq.TopologyOptions{DeliveryLimit: 2})
	d := newDB(t, uniqueName(t))
	var obs outageCounter
	proc, proxy := outageProcessor(t, d, 100*time.Millisecond, &obs)
	publish(t, conn, topo.Queue, 0, n, msgID)

	cfg := config(t, topo.Queue)
	cfg.BatchSize, cfg.Workers = 20, 2
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	rec.waitUntil(t, 30*time.Second, "100 acked", func() bool { return rec.distinctAcked() >= 100 })
	proxy.Refuse()
	poll(t, 30*time.Second, "several Retry outcomes for the outage", func() bool { return obs.unavailable.Load() >= 6 })
	stalled := rec.distinctAcked()
	proxy.Restore()
	rec.waitUntil(t, 30*time.Second, "every message acked", func() bool { return rec.distinctAcked() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("%d unavailable retries, %d connections refused, %d acked during the outage; stats %+v", obs.unavailable.Load(), proxy.Refused(), stalled, st)
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
	if dl := drain(t, conn, topo.DeadLetterQueue); len(dl) != 0 {
		t.Fatalf("%d healthy messages dead-lettered by the outage (first %s)", len(dl), dl[0].MessageId)
	}
	// Only a batch whose COMMIT the cut caught (its outcome unknown: it
	// counts, lest a message whose commits always fail loop forever) spends
	// one delivery; at most one batch per worker was there.
	if st.Requeued > uint64(cfg.Workers*cfg.BatchSize) || st.Redelivered > st.Requeued || st.DeadLettered != 0 {
		t.Fatalf("stats %+v: an outage may spend at most one delivery of the %d messages in flight", st, cfg.Workers*cfg.BatchSize)
	}
	if q := depth(t, conn, topo.Queue); q != 0 {
		t.Fatalf("queue holds %d", q)
	}
}

// Run stops within its grace while the database is down and the processor
// would wait for it indefinitely; the held deliveries return to the queue
// unacked and uncounted, and nothing was applied.
func TestShutdownDuringDatabaseOutage(t *testing.T) {
	t.Parallel()
	const n = 30
	conn := broker(t)
	topo := topology(t, conn, &idemrabbitmq.TopologyOptions{DeliveryLimit: 2})
	d := newDB(t, uniqueName(t))
	proc, proxy := outageProcessor(t, d, -1, nil) // wait for the database until cancelled

	cfg := config(t, topo.Queue)
	cfg.ShutdownGrace = 300 * time.Millisecond
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	// The outage begins once the consumer checked its inbox and consumes.
	waitConsuming(t, conn, topo.Queue)
	proxy.Refuse()
	publish(t, conn, topo.Queue, 0, n, msgID)
	poll(t, 30*time.Second, "the consumer to hit the outage", func() bool { return proxy.Refused() >= 3 })
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Run took %v to stop with a grace of %v", took, cfg.ShutdownGrace)
	}
	poll(t, 10*time.Second, "the held deliveries to return to the queue", func() bool { return depth(t, conn, topo.Queue) == n })
	if st := c.Stats(); st.Requeued != 0 || st.Applied != 0 || st.DeadLettered != 0 {
		t.Fatalf("stats %+v, want nothing settled", st)
	}
	if rows, _ := d.effects(t); rows != 0 {
		t.Fatalf("effects = %d, want none", rows)
	}
}

// heldWatch observes the processor for the Retry outcomes the consumer
// holds: Blameless, because the database stayed unreachable.
type heldWatch struct {
	mu    sync.Mutex
	seen  map[string]int // message ID → such outcomes
	total int
}

func newHeldWatch() *heldWatch { return &heldWatch{seen: map[string]int{}} }

func (h *heldWatch) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	if r.Outcome != idem.Retry || !r.Blameless || !errors.Is(r.Err, idem.ErrUnavailable) {
		return
	}
	h.mu.Lock()
	h.seen[r.MessageID]++
	h.total++
	h.mu.Unlock()
}

// count is how many held outcomes were observed.
func (h *heldWatch) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total
}

// rerun reports whether a message was held and then processed again: it
// ended in a held Retry twice, so the consumer held it in between.
func (h *heldWatch) rerun() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range h.seen {
		if k >= 2 {
			return true
		}
	}
	return false
}

func (h *heldWatch) ids() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.seen))
	for id := range h.seen {
		ids = append(ids, id)
	}
	return ids
}

// holdingSetup is a consumer's set-up for a database outage that outlasts
// the processor's WaitUnavailable: n messages on a fresh quorum queue, a
// processor whose pool reaches the database through a proxy, and watches
// on what is held and settled.
type holdingSetup struct {
	conn  *amqp.Connection
	topo  idemrabbitmq.Topology
	d     *db
	proc  *idem.Processor[pgx.Tx]
	proxy *netfault.Proxy
	held  *heldWatch
	rec   *settlements
	cfg   *idemrabbitmq.Config
	n     int // messages in all; the last quarter is published after the cut
}

func newHoldingSetup(t *testing.T, n int) *holdingSetup {
	t.Helper()
	s := &holdingSetup{conn: broker(t), held: newHeldWatch(), rec: newSettlements(), n: n}
	s.topo = topology(t, s.conn, nil)
	s.d = newDB(t, uniqueName(t))
	s.proc, s.proxy = outageProcessor(t, s.d, 50*time.Millisecond, s.held)
	publish(t, s.conn, s.topo.Queue, 0, n-n/4, msgID)
	s.cfg = config(t, s.topo.Queue)
	s.cfg.BatchSize, s.cfg.Workers = 20, 2
	s.cfg.Hooks = []idem.Hook{s.rec}
	return s
}

// cutUntilHeld waits for some messages to be applied, cuts the database,
// publishes the last quarter of the messages (so that some arrive during
// the outage however fast the first ones went) and waits until the
// consumer holds deliveries and has processed one again.
func (s *holdingSetup) cutUntilHeld(t *testing.T) {
	t.Helper()
	s.rec.waitUntil(t, 30*time.Second, "60 acked", func() bool { return s.rec.distinctAcked() >= 60 })
	s.proxy.Refuse()
	publish(t, s.conn, s.topo.Queue, s.n-s.n/4, s.n/4, msgID)
	poll(t, 30*time.Second, "a delivery held and processed again during the outage", s.held.rerun)
}

// Run is cancelled while the consumer holds deliveries for an outage that
// outlasts the processor's WaitUnavailable: Run returns within its grace,
// the held deliveries are never acked and return to the queue, and a new
// consumer applies every message once when the database is back.
func TestShutdownWhileDeliveriesAreHeld(t *testing.T) {
	t.Parallel()
	const n = 200
	s := newHoldingSetup(t, n)
	s.cfg.ShutdownGrace = 2 * time.Second
	c, err := idemrabbitmq.NewConsumer(s.proc, s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	s.cutUntilHeld(t)
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if took := time.Since(start); took >= s.cfg.ShutdownGrace {
		t.Fatalf("Run took %v to stop with deliveries held, grace %v", took, s.cfg.ShutdownGrace)
	}
	held := s.held.ids()
	s.rec.mu.Lock()
	acked := len(s.rec.acked)
	for _, id := range held {
		if s.rec.acked[id] != 0 {
			t.Errorf("held message %s was acked during the outage", id)
		}
	}
	s.rec.mu.Unlock()
	st := c.Stats()
	t.Logf("%d messages held, %d acked before the shutdown; stats %+v", len(held), acked, st)
	if st.DeadLettered != 0 || s.rec.deadLettered() != 0 {
		t.Fatalf("stats %+v: the outage dead-lettered messages", st)
	}
	// The broker returns the unacked deliveries on its own time.
	var q int
	poll(t, 10*time.Second, fmt.Sprintf("the %d unacked deliveries back in the queue", n-acked), func() bool {
		q = depth(t, s.conn, s.topo.Queue)
		return q >= n-acked
	})
	if q != n-acked {
		t.Fatalf("queue holds %d after the shutdown, want the %d messages not acked", q, n-acked)
	}

	s.proxy.Restore()
	c2, err := idemrabbitmq.NewConsumer(s.proc, s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop = run(t, c2)
	s.rec.waitUntil(t, 30*time.Second, "every message acked", func() bool { return s.rec.distinctAcked() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st2 := c2.Stats()
	t.Logf("second consumer: stats %+v", st2)
	if rows, distinct := s.d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
	if st2.Redelivered < uint64(len(held)) {
		t.Fatalf("%d redeliveries, want at least the %d held messages back from the broker", st2.Redelivered, len(held))
	}
	if dl := drain(t, s.conn, s.topo.DeadLetterQueue); len(dl) != 0 || st2.DeadLettered != 0 || s.rec.deadLettered() != 0 {
		t.Fatalf("%d messages in the dead-letter queue, stats %+v; want none", len(dl), st2)
	}
	if q := depth(t, s.conn, s.topo.Queue); q != 0 {
		t.Fatalf("queue holds %d", q)
	}
}

// syncBuffer is an io.Writer tests can read while a logger writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// reconnects records why sessions ended.
type reconnects struct {
	*settlements
	mu   sync.Mutex
	errs []error
}

func (r *reconnects) OnReconnect(_, _ string, err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

func (r *reconnects) list() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

// The connection drops while the consumer holds deliveries for a database
// outage. The held tags die with the channel: the consumer reconnects by
// itself, never acks an old tag on the new channel (which the broker would
// close with 406 PRECONDITION_FAILED, again and again), holds the
// redeliveries until the database is back, and applies every message once.
func TestConnectionLossWhileDeliveriesAreHeld(t *testing.T) {
	t.Parallel()
	const n = 200
	s := newHoldingSetup(t, n)
	var logs syncBuffer
	s.cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	hooks := &reconnects{settlements: s.rec}
	s.cfg.Hooks = []idem.Hook{hooks}
	c, err := idemrabbitmq.NewConsumer(s.proc, s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	s.cutUntilHeld(t)
	held := s.held.ids()
	if !c.DropConnection() {
		t.Fatal("no connection to drop while deliveries were held")
	}
	// The new session receives the held messages again and, the database
	// still down, holds them in turn.
	poll(t, 30*time.Second, "the consumer to reconnect", func() bool { return c.Stats().Reconnects >= 1 })
	before := s.held.count()
	poll(t, 30*time.Second, "the new session to hold redeliveries", func() bool {
		return c.Stats().Redelivered > 0 && s.held.count() > before
	})
	s.proxy.Restore()
	// A second session end means a channel or connection closed that the
	// test did not drop: stop waiting and say why.
	poll(t, 30*time.Second, "every message acked", func() bool {
		return s.rec.distinctAcked() == n || c.Stats().Reconnects > 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("%d messages held at the drop; stats %+v; sessions ended by %v", len(held), st, hooks.list())
	if out := logs.String(); strings.Contains(out, "PRECONDITION_FAILED") || strings.Contains(out, "unknown delivery tag") {
		t.Errorf("the broker closed a channel over a delivery tag:\n%s", out)
	}
	for _, err := range hooks.list() {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			t.Errorf("session ended by %v", err)
		}
	}
	if st.Reconnects != 1 {
		t.Fatalf("%d reconnects (%v), want exactly 1 for the one drop", st.Reconnects, hooks.list())
	}
	if st.Redelivered < uint64(len(held)) {
		t.Fatalf("%d redeliveries, want at least the %d held messages back from the broker", st.Redelivered, len(held))
	}
	if rows, distinct := s.d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
	if dl := drain(t, s.conn, s.topo.DeadLetterQueue); len(dl) != 0 || st.DeadLettered != 0 || s.rec.deadLettered() != 0 {
		t.Fatalf("%d messages in the dead-letter queue, stats %+v; want none", len(dl), st)
	}
	if q := depth(t, s.conn, s.topo.Queue); q != 0 {
		t.Fatalf("queue holds %d", q)
	}
}

// A producer republishes a message with the same message_id and a fresh
// AMQP timestamp, or one weeks old: its event time is the time inside its
// UUIDv7 ID, so the copy is a Duplicate, never Expired or applied again.
// A message whose ID carries no time is timed by its x-event-time header
// ahead of its timestamp.
func TestRepublishWithAnotherTimestampIsADuplicate(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	obs := newOutcomes()
	cfg := config(t, topo.Queue)
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil, func(c *idem.Config[pgx.Tx]) { c.Hooks = append(c.Hooks, obs) }), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	pub, err := idemrabbitmq.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	now := time.Now()
	stale := now.Add(-30 * 24 * time.Hour) // older than the inbox's 14-day window
	id := uuidV7(now)
	ctx := context.Background()
	for _, ts := range []time.Time{now, stale, now.Add(time.Minute)} {
		if err := pub.Publish(ctx, "", topo.Queue, amqp.Publishing{MessageId: id, Timestamp: ts, Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Publish(ctx, "", topo.Queue, amqp.Publishing{MessageId: "inv-timed-by-header", Timestamp: stale,
		Headers: amqp.Table{idembroker.HeaderEventTime: now.UTC().Format(time.RFC3339)}, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	rec.waitUntil(t, 30*time.Second, "every delivery settled", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.acked[id]+rec.dead[id] == 3 && rec.acked["inv-timed-by-header"]+rec.dead["inv-timed-by-header"] == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	obs.mu.Lock()
	var got []string
	for _, r := range obs.seen[id] {
		got = append(got, fmt.Sprintf("%v/%v", r.Outcome, r.TimeSource))
	}
	header := obs.seen["inv-timed-by-header"]
	obs.mu.Unlock()
	if want := "[applied/id duplicate/id duplicate/id]"; fmt.Sprint(got) != want {
		t.Fatalf("outcomes %v, want %s", got, want)
	}
	if len(header) != 1 || header[0].Outcome != idem.Applied || header[0].TimeSource != idem.TimeFromHeader {
		t.Fatalf("the message timed by its header: %+v", header)
	}
	if st := c.Stats(); st.Applied != 2 || st.Duplicates != 2 || st.DeadLettered != 0 {
		t.Fatalf("stats %+v", st)
	}
	if rows, _ := d.effects(t); rows != 2 {
		t.Fatalf("effects %d, want 2", rows)
	}
}

// A message whose x-event-time header is not a time, and whose ID carries
// none, is bad input: it is dead-lettered with idem.ErrBadTime, as on Kafka,
// and the message beside it is applied.
func TestBadEventTimeIsDeadLettered(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, m := range []amqp.Publishing{
		{MessageId: "bad-time", Headers: amqp.Table{idembroker.HeaderEventTime: "yesterday"}, Body: []byte("bad time")},
		{MessageId: "good-time", Headers: amqp.Table{idembroker.HeaderEventTime: time.Now().UTC().Format(time.RFC3339)}, Body: []byte("fine")},
	} {
		c, err := ch.PublishWithDeferredConfirm("", topo.Queue, false, false, m)
		if err != nil || !c.Wait() {
			t.Fatalf("publishing: %v", err)
		}
	}
	cfg := config(t, topo.Queue)
	cfg.DeadLetterExchange = topo.DeadLetterExchange
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	rec.waitUntil(t, 30*time.Second, "both settled", func() bool { return rec.distinctAcked() == 1 && rec.deadLettered() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, _ := d.effects(t); rows != 1 {
		t.Fatalf("effects = %d, want only the message with a readable time", rows)
	}
	var dead []amqp.Delivery
	poll(t, 10*time.Second, "the DLQ", func() bool {
		dead = append(dead, drain(t, conn, topo.DeadLetterQueue)...)
		return len(dead) > 0
	})
	if reason, _ := dead[0].Headers[idembroker.HeaderReason].(string); dead[0].MessageId != "bad-time" || !strings.Contains(reason, idem.ErrBadTime.Error()) || !strings.Contains(reason, "yesterday") {
		t.Fatalf("dead letter %q with reason %q", dead[0].MessageId, reason)
	}
}
