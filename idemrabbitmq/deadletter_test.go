package idemrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/netfault"
)

// bareQueue declares a classic queue with no dead-letter exchange at all,
// and deletes it and "<queue>.dlq" when t ends.
func bareQueue(t testing.TB, conn *amqp.Connection) string {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q := uniqueName(t)
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			t.Logf("deleting %s: %v", q, err)
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			return
		}
		for _, name := range []string{q, q + ".dlq"} {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				t.Logf("deleting %s: %v", name, err)
				return
			}
		}
	})
	return q
}

// permanentOn fails permanently for the listed IDs and writes the others.
func permanentOn(ids ...string) idem.Handler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		for _, id := range ids {
			if m.ID == id {
				return idem.Permanent(fmt.Errorf("customer of %s does not exist", id))
			}
		}
		return write(ctx, tx, m)
	}
}

// A queue without any dead-letter exchange used to discard dead letters
// (basic.reject without requeue) while the log and Stats counted them. The
// consumer now declares "<queue>.dlq" and publishes them there, with why,
// who, how many attempts and where from.
func TestDeadLettersWithoutDLXAreKept(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	q := bareQueue(t, conn)
	d := newDB(t, uniqueName(t))
	publish(t, conn, q, 0, 5, msgID)

	cfg := config(t, q)
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	c, err := idemrabbitmq.NewConsumer(d.processor(t, permanentOn(msgID(2)), func(c *idem.Config[pgx.Tx]) { c.Hooks = []idem.Hook{m} }), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	rec.waitUntil(t, 30*time.Second, "every message settled", func() bool { return rec.distinctAcked() == 4 && rec.deadLettered() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// The processor's one hook value saw the consumer's side too.
	if n, err := testutil.GatherAndCount(reg, "idem_dead_letters_total"); err != nil || n != 1 {
		t.Fatalf("idem_dead_letters_total: %d series (%v)", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idem_settled_total Deliveries settled with the broker, by action (ack, redeliver, hold, dead_letter).
# TYPE idem_settled_total counter
idem_settled_total{action="ack",consumer="billing-invoice"} 4
idem_settled_total{action="dead_letter",consumer="billing-invoice"} 1
`), "idem_settled_total"); err != nil {
		t.Fatal(err)
	}
	dead := drain(t, conn, q+".dlq")
	if len(dead) != 1 {
		t.Fatalf("%d messages in %s.dlq, want the one dead letter (stats %+v)", len(dead), q, c.Stats())
	}
	h := dead[0].Headers
	if reason, _ := h[idembroker.HeaderReason].(string); dead[0].MessageId != msgID(2) || !strings.Contains(reason, "does not exist") {
		t.Fatalf("dead letter %s, reason %q", dead[0].MessageId, reason)
	}
	if h[idembroker.HeaderOutcome] != "dead_lettered" || h[idembroker.HeaderConsumer] != "billing-invoice" ||
		h[idembroker.HeaderOrigin] != q {
		t.Fatalf("dead letter headers %v", h)
	}
	if n, ok := h[idembroker.HeaderAttempts].(int64); !ok || n < 1 {
		t.Fatalf("x-idem-attempts %#v, want the processor's count", h[idembroker.HeaderAttempts])
	}
	if dead[0].DeliveryMode != amqp.Persistent {
		t.Fatalf("dead letter delivery mode %d, want persistent", dead[0].DeliveryMode)
	}
	if n := depth(t, conn, q); n != 0 {
		t.Fatalf("queue holds %d", n)
	}
}

// A consumer whose dead letters would have nowhere to go does not start:
// a dead-letter exchange that does not exist is refused before any
// message is taken.
func TestRunRefusesMissingDeadLetterExchange(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	q := bareQueue(t, conn)
	d := newDB(t, uniqueName(t))
	publish(t, conn, q, 0, 3, msgID)
	cfg := config(t, q)
	cfg.DeadLetterExchange = uniqueName(t) + ".nowhere"
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if !errors.Is(err, idemrabbitmq.ErrNoDeadLetterDestination) || !strings.Contains(err.Error(), cfg.DeadLetterExchange) {
		t.Fatalf("Run = %v, want an error wrapping ErrNoDeadLetterDestination that names the exchange", err)
	}
	if n := depth(t, conn, q); n != 3 || c.Stats().Delivered != 0 {
		t.Fatalf("queue holds %d, %d delivered: the consumer took messages before refusing", n, c.Stats().Delivered)
	}
}

// The route to the dead-letter queue disappears while the consumer runs:
// the broker returns the dead letters. They stay unacked and are published
// again once the route is back, and every return is drained: a leftover
// return used to fail the next publish, which had gone through, so 2 dead
// letters became 4 copies.
func TestEveryReturnIsDrained(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	var logs syncBuffer
	cfg := config(t, topo.Queue)
	cfg.DeadLetterExchange = topo.DeadLetterExchange
	cfg.BatchWait = 100 * time.Millisecond // the poison pair shares a batch
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, permanentOn(msgID(1), msgID(2), msgID(11), msgID(12))), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitConsuming(t, conn, topo.Queue)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.QueueUnbind(topo.DeadLetterQueue, topo.Queue, topo.DeadLetterExchange, nil); err != nil {
		t.Fatal(err)
	}
	publish(t, conn, topo.Queue, 0, 4, msgID)
	poll(t, 30*time.Second, "the returned dead letters to be published again", func() bool {
		return strings.Count(logs.String(), "unroutable") >= 2
	})
	if st := c.Stats(); st.DeadLettered != 0 || rec.deadLettered() != 0 {
		t.Fatalf("stats %+v: a returned dead letter was counted", st)
	}
	if err := ch.QueueBind(topo.DeadLetterQueue, topo.Queue, topo.DeadLetterExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	rec.waitUntil(t, 30*time.Second, "both dead letters confirmed", func() bool { return rec.deadLettered() == 2 })
	// Two more, with the route in place: exactly one copy each.
	publish(t, conn, topo.Queue, 10, 4, msgID)
	rec.waitUntil(t, 30*time.Second, "every message settled", func() bool { return rec.distinctAcked() == 4 && rec.deadLettered() == 4 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var dead []amqp.Delivery
	poll(t, 10*time.Second, "the DLQ to hold the dead letters", func() bool {
		dead = append(dead, drain(t, conn, topo.DeadLetterQueue)...)
		return len(dead) >= 4
	})
	copies := map[string]int{}
	for _, m := range dead {
		copies[m.MessageId]++
	}
	want := map[string]int{msgID(1): 1, msgID(2): 1, msgID(11): 1, msgID(12): 1}
	if fmt.Sprint(copies) != fmt.Sprint(want) {
		t.Fatalf("dead-letter copies %v, want one of each: %v", copies, want)
	}
	if st := c.Stats(); st.DeadLettered != 4 || st.Requeued != 0 {
		t.Fatalf("stats %+v", st)
	}
	if n := depth(t, conn, topo.Queue); n != 0 {
		t.Fatalf("queue holds %d", n)
	}
}

// The broker stops reading from the connection dead letters are published
// on (as a memory or disk alarm blocks a publishing connection): the dead
// letter waits, unacked, and the consumer keeps applying and acking the
// messages behind it. Once the connection passes again, the dead letter is
// confirmed and only then is its original acked.
func TestBlockedDeadLetterConnectionDoesNotStallConsumption(t *testing.T) {
	t.Parallel()
	const healthy = 50
	conn := broker(t)
	q := bareQueue(t, conn)
	d := newDB(t, uniqueName(t))
	proxy := netfault.New(t, brokerHost(t))
	cfg := config(t, q)
	cfg.DeadLetterURL = proxy.URL(t, amqpURL())
	cfg.BatchSize = 10
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, permanentOn(msgID(0))), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitConsuming(t, conn, q)
	proxy.Freeze()
	publish(t, conn, q, 0, 1+healthy, msgID)
	rec.waitUntil(t, 30*time.Second, "the healthy messages acked while the dead letter waits", func() bool { return rec.distinctAcked() == healthy })
	if st := c.Stats(); st.DeadLettered != 0 || depth(t, conn, q+".dlq") != 0 {
		t.Fatalf("stats %+v: the dead letter went through a connection that passes nothing", st)
	}
	proxy.Restore()
	rec.waitUntil(t, 30*time.Second, "the dead letter confirmed", func() bool { return rec.deadLettered() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var dead []amqp.Delivery
	poll(t, 10*time.Second, "the DLQ", func() bool {
		dead = append(dead, drain(t, conn, q+".dlq")...)
		return len(dead) > 0
	})
	if len(dead) != 1 || dead[0].MessageId != msgID(0) {
		t.Fatalf("%d dead letters, want only %s", len(dead), msgID(0))
	}
	if rows, _ := d.effects(t); rows != healthy {
		t.Fatalf("effects %d, want %d", rows, healthy)
	}
	if n := depth(t, conn, q); n != 0 {
		t.Fatalf("queue holds %d", n)
	}
}

// A handler error not marked permanent is retried in place by the
// processor up to its RetryPolicy.MaxAttempts and dead-lettered once, on
// a quorum queue and on a classic queue (which counts nothing): never
// requeued, one log line for it, and x-idem-attempts says what the
// processor counted.
func TestRetriesExhaustedAreDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	const maxAttempts = 4
	for _, classic := range []bool{false, true} {
		t.Run(fmt.Sprintf("classic=%v", classic), func(t *testing.T) {
			t.Parallel()
			conn := broker(t)
			topo := topology(t, conn, &idemrabbitmq.TopologyOptions{DeliveryLimit: 2})
			if classic {
				topo = classicTopology(t, conn)
			}
			d := newDB(t, uniqueName(t))
			var logs syncBuffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			var runs atomic.Int64
			h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
				if m.ID == msgID(0) {
					runs.Add(1)
					return errors.New("invoice service unavailable")
				}
				return write(ctx, tx, m)
			}
			var attempts atomic.Int64
			proc := d.processor(t, h, func(c *idem.Config[pgx.Tx]) {
				c.Retry = idem.RetryPolicy{MaxAttempts: maxAttempts, Backoff: idem.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}}
				c.Logger = logger
				c.Hooks = append(c.Hooks, observerFunc(func(r idem.Result) {
					if r.MessageID == msgID(0) && r.Outcome == idem.DeadLettered {
						attempts.Store(int64(r.Attempts))
					}
				}))
			})
			publish(t, conn, topo.Queue, 0, 4, msgID)
			cfg := config(t, topo.Queue)
			cfg.Logger = logger
			cfg.BatchSize = 1 // no batch run before the message's own
			rec := newSettlements()
			cfg.Hooks = []idem.Hook{rec}
			c, err := idemrabbitmq.NewConsumer(proc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			rec.waitUntil(t, 30*time.Second, "every message settled", func() bool { return rec.distinctAcked() == 3 && rec.deadLettered() == 1 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			var dead []amqp.Delivery
			poll(t, 10*time.Second, "the DLQ", func() bool {
				dead = append(dead, drain(t, conn, topo.DeadLetterQueue)...)
				return len(dead) > 0
			})
			if len(dead) != 1 || dead[0].MessageId != msgID(0) {
				t.Fatalf("%d dead letters, want only %s", len(dead), msgID(0))
			}
			reason, _ := dead[0].Headers[idembroker.HeaderReason].(string)
			if !strings.Contains(reason, idem.ErrRetriesExhausted.Error()) || !strings.Contains(reason, "invoice service unavailable") {
				t.Fatalf("reason %q", reason)
			}
			if n := runs.Load(); n != maxAttempts {
				t.Fatalf("the handler ran %d times, want RetryPolicy.MaxAttempts = %d", n, maxAttempts)
			}
			if got := dead[0].Headers[idembroker.HeaderAttempts]; got != attempts.Load() || got != int64(maxAttempts) {
				t.Fatalf("x-idem-attempts %v, want the processor's count %d, MaxAttempts %d", got, attempts.Load(), maxAttempts)
			}
			if st := c.Stats(); st.Requeued != 0 || st.DeadLettered != 1 || st.Applied != 3 {
				t.Fatalf("stats %+v", st)
			}
			var lines []string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, msgID(0)) {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 || !strings.Contains(lines[0], "dead_lettered") {
				t.Fatalf("%d log lines about the dead letter, want 1:\n%s", len(lines), strings.Join(lines, "\n"))
			}
		})
	}
}
