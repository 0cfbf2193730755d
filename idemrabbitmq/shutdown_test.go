package idemrabbitmq_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
)

// A consumer stopped while it waits for an unreachable inbox at start
// returns at once: it never connects to consume, and takes no delivery
// (the message stays in the queue, never delivered).
func TestRunStoppedWhileWaitingForTheInboxTakesNothing(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	publish(t, conn, topo.Queue, 0, 1, msgID)
	d := newDB(t, uniqueName(t))
	pool, proxy := d.poolVia(t, "connect_timeout=1")
	t.Cleanup(proxy.Restore)
	proc := d.processorOn(t, pool, nil, func(c *idem.Config[pgx.Tx]) {
		c.TxTimeout, c.CommitTimeout = time.Second, time.Second
	})
	proxy.Stop()
	var logs syncBuffer
	cfg := config(t, topo.Queue)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	poll(t, 30*time.Second, "holding at start", func() bool { return c.Health().Holding })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "msg=consuming") {
		t.Errorf("the consumer started consuming after it was stopped:\n%s", logs.String())
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	m, ok, err := ch.Get(topo.Queue, false)
	if err != nil || !ok {
		t.Fatalf("the message is not in the queue: %v %v", ok, err)
	}
	if m.Redelivered {
		t.Errorf("the message was delivered to the stopped consumer (redelivered flag set)")
	}
	_ = m.Nack(false, true)
}
