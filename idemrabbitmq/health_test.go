package idemrabbitmq_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
)

// Health follows a consumer through its life: not running, connected and
// ready, holding while its database is away (a proxy that stops
// answering), ready again once every held delivery is applied, back after
// a lost connection, stopped.
func TestHealthFollowsTheConsumer(t *testing.T) {
	t.Parallel()
	const n = 30
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	pool, proxy := d.poolVia(t, "connect_timeout=1")
	t.Cleanup(proxy.Restore) // the pool closes without waiting for silent connections
	proc := d.processorOn(t, pool, nil, func(c *idem.Config[pgx.Tx]) {
		c.Retry = idem.RetryPolicy{Backoff: idem.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}, WaitUnavailable: 300 * time.Millisecond}
		c.TxTimeout, c.CommitTimeout = time.Second, time.Second
	})
	cfg := config(t, topo.Queue)
	cfg.BatchSize = 5
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h := c.Health(); h.Running || h.Connected || !errors.Is(h.Ready(), idembroker.ErrNotReady) {
		t.Fatalf("before Run: %+v", h)
	}
	if h := c.Health(); h.Consumer != "billing-invoice" || h.Source != topo.Queue {
		t.Fatalf("names: %+v", h)
	}

	stop := run(t, c)
	poll(t, 30*time.Second, "connected", func() bool {
		if h := c.Health(); !h.Started.IsZero() && !h.Running {
			t.Fatalf("Run returned: %v", stop())
		}
		return c.Health().Connected
	})
	if err := c.Health().Ready(); err != nil {
		t.Fatalf("connected: Ready() = %v", err)
	}
	publish(t, conn, topo.Queue, 0, 10, msgID)
	rec.waitUntil(t, 30*time.Second, "10 acked", func() bool { return rec.distinctAcked() == 10 })
	before := c.Health()
	if before.LastSuccess.IsZero() || before.Holding {
		t.Fatalf("after 10 acks: %+v", before)
	}
	poll(t, 30*time.Second, "nothing in flight", func() bool { return c.Health().InFlight == 0 })

	proxy.Stop()
	publish(t, conn, topo.Queue, 10, n-10, msgID)
	poll(t, 60*time.Second, "holding", func() bool { return c.Health().Holding })
	h := c.Health()
	err = h.Ready()
	if err == nil || !strings.Contains(err.Error(), "holding messages") {
		t.Fatalf("during the outage: Ready() = %v", err)
	}
	if !strings.Contains(h.HoldReason, idem.ErrUnavailable.Error()) || h.HoldingSince.Before(before.LastSuccess) {
		t.Fatalf("during the outage: %+v", h)
	}
	if h.InFlight == 0 || h.InFlight > n-10 {
		t.Fatalf("during the outage: %d in flight, want the held deliveries (at most the %d published)", h.InFlight, n-10)
	}
	if err := h.Live(time.Now()); err != nil {
		t.Fatalf("during the outage: Live() = %v, want alive", err)
	}
	if !h.Connected {
		t.Fatalf("during a database outage the broker session is still up: %+v", h)
	}

	proxy.Restore()
	rec.waitUntil(t, 60*time.Second, "every message acked", func() bool { return rec.distinctAcked() == n })
	poll(t, 30*time.Second, "ready after the outage", func() bool { return c.Health().Ready() == nil })
	if after := c.Health(); !after.LastSuccess.After(h.HoldingSince) {
		t.Fatalf("after the outage: %+v", after)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}

	if !c.DropConnection() {
		t.Fatal("no connection to drop")
	}
	poll(t, 30*time.Second, "reconnected", func() bool {
		h := c.Health()
		return h.Reconnects >= 1 && h.Connected
	})
	if h := c.Health(); h.LastError == "" {
		t.Fatalf("after a lost connection: no last error: %+v", h)
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if h := c.Health(); h.Running || h.Connected || h.Ready() == nil || h.Live(time.Now()) == nil {
		t.Fatalf("after Run: %+v", h)
	}
}

// A database unreachable at start is a hold from the first moment: the
// consumer waits for it (Run's check) and says so, and is ready once it
// answers.
func TestHealthHoldsWhileTheDatabaseIsAwayAtStart(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	pool, proxy := d.poolVia(t, "connect_timeout=1")
	t.Cleanup(proxy.Restore)
	proc := d.processorOn(t, pool, nil, func(c *idem.Config[pgx.Tx]) {
		c.TxTimeout, c.CommitTimeout = time.Second, time.Second
	})
	proxy.Stop()
	c, err := idemrabbitmq.NewConsumer(proc, config(t, topo.Queue))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	poll(t, 30*time.Second, "holding at start", func() bool { return c.Health().Holding })
	if err := c.Health().Ready(); err == nil || !strings.Contains(err.Error(), "holding") {
		t.Fatalf("database away at start: Ready() = %v", err)
	}
	proxy.Restore()
	poll(t, 30*time.Second, "ready", func() bool { return c.Health().Ready() == nil })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
