package idemrabbitmq_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/netfault"
)

// A cluster whose first node is down at start: the consumer and its
// dead-letter connection are turned away by it and go to the next node of
// the list at once; every message is applied once.
func TestURLsSkipARefusingNode(t *testing.T) {
	t.Parallel()
	const n = 30
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	dead := netfault.New(t, brokerHost(t))
	dead.Refuse() // the node's host answers, its broker does not
	alive := netfault.New(t, brokerHost(t))
	publish(t, conn, topo.Queue, 0, n, msgID)
	cfg := config(t, topo.Queue)
	cfg.URL = ""
	cfg.URLs = []string{dead.URL(t, amqpURL()), alive.URL(t, amqpURL())}
	// A backoff longer than the test: a second node reached only after
	// the backoff would time the test out.
	cfg.ReconnectBackoff = idem.Backoff{Initial: time.Hour, Max: time.Hour}
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(d.processor(t, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	rec.waitUntil(t, 30*time.Second, "every message acked", func() bool { return rec.distinctAcked() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows for %d messages, want %d", rows, distinct, n)
	}
	// Both connections (consuming, dead letters) tried the dead node first.
	if dead.Refused() < 2 || alive.Accepted() < 2 {
		t.Errorf("dead node refused %d, live node accepted %d connections; want at least 2 each", dead.Refused(), alive.Accepted())
	}
	if got := c.Stats().Reconnects; got != 0 {
		t.Errorf("reconnects = %d: the refusing node cost a session", got)
	}
}

// The node the consumer is on goes down mid-stream: the consumer
// reconnects to the next node, whose turn it is, and the broker's
// redeliveries of what was in flight are duplicates.
func TestURLsFailOverToTheNextNode(t *testing.T) {
	t.Parallel()
	const n = 400
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	first := netfault.New(t, brokerHost(t))
	second := netfault.New(t, brokerHost(t))
	publish(t, conn, topo.Queue, 0, n, msgID)
	cfg := config(t, topo.Queue)
	cfg.URL = ""
	cfg.URLs = []string{first.URL(t, amqpURL()), second.URL(t, amqpURL())}
	cfg.BatchSize, cfg.Prefetch = 10, 50
	rec := newSettlements()
	failed := make(chan struct{})
	acks := 0
	rec.onAck = func(idem.Result) {
		// Called from the consumer's loop, one at a time.
		if acks++; acks == n/4 {
			first.Refuse() // the node dies: its connections cut, new ones refused
			close(failed)
		}
	}
	cfg.Hooks = []idem.Hook{rec}
	obs := newOutcomes()
	proc := d.processor(t, nil, func(c *idem.Config[pgx.Tx]) { c.Hooks = append(c.Hooks, obs) })
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	select {
	case <-failed:
	case <-time.After(60 * time.Second):
		t.Fatal("the consumer never acked a quarter of the messages")
	}
	rec.waitUntil(t, 60*time.Second, "every message acked", func() bool { return rec.distinctAcked() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows for %d messages, want one each", rows, distinct)
	}
	if got := depth(t, conn, topo.Queue); got != 0 {
		t.Errorf("queue depth %d after the drain, want 0", got)
	}
	if c.Stats().Reconnects < 1 || second.Accepted() < 2 {
		t.Errorf("reconnects %d, second node accepted %d: the consumer did not move", c.Stats().Reconnects, second.Accepted())
	}
	t.Logf("duplicates after the failover: %d; refused by the dead node: %d", obs.count(func(r idem.Result) bool { return r.Outcome == idem.Duplicate }), first.Refused())
}
