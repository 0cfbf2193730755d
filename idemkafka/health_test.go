package idemkafka_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemkafka"
)

// pollHealth waits for cond on the consumer's health, re-checking every
// 20ms; it fails at once when Run returned.
func pollHealth[TTx any](t testing.TB, c *idemkafka.Consumer[TTx], stop func() error, d time.Duration, what string, cond func(idembroker.Health) bool) idembroker.Health {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		h := c.Health()
		if cond(h) {
			return h
		}
		if !h.Started.IsZero() && !h.Running {
			t.Fatalf("waiting for %s: Run returned: %v", what, stop())
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; health %+v", d, what, h)
		}
		<-tick.C
	}
}

// Health follows a consumer: a member of its group and ready; the lag of
// each partition as records wait behind a database that stopped answering
// (a proxy), while it holds them; ready again with no lag once every
// record is applied, once; stopped.
func TestHealthFollowsTheConsumer(t *testing.T) {
	t.Parallel()
	const n, parts = 40, 2
	k := newKafka(t)
	topic := k.topic(t, "health", parts)
	group := k.group("health")
	prod := k.client(t)
	d := newDB(t)
	store, proxy := d.throughProxy(t)
	out := newOutcomes()
	cms := newCommits(t, ends(n, parts))
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), outageProcessor(t, store, out), &idemkafka.Config{
		MaxBatch: 5,
		Hooks:    []idem.Hook{cms},
	})
	if err != nil {
		t.Fatal(err)
	}
	if h := c.Health(); h.Running || h.Connected || !errors.Is(h.Ready(), idembroker.ErrNotReady) || h.Source != topic {
		t.Fatalf("before Run: %+v", h)
	}
	stop := run(t, c)
	pollHealth(t, c, stop, 30*time.Second, "a member of the group", func(h idembroker.Health) bool { return h.Connected })

	produce(t, prod, topic, parts, 0, 10, msgID)
	wait(t, cms.reached(ends(10, parts)), 30*time.Second, "the first records committed")
	h := pollHealth(t, c, stop, 30*time.Second, "no lag after the first records", func(h idembroker.Health) bool {
		return len(h.Lag) == parts && h.TotalLag == 0 && !h.LastSuccess.IsZero()
	})
	if h.Ready() != nil {
		t.Fatalf("after the first records: %+v (ready: %v)", h, h.Ready())
	}
	for _, l := range h.Lag {
		if l.Topic != topic || l.HighWatermark != 5 || l.Committed != 5 {
			t.Fatalf("partition lag %+v, want 5 records in and 5 committed on each", l)
		}
	}

	proxy.Stop()
	produce(t, prod, topic, parts, 10, n-10, msgID)
	// A held partition is paused, so its lag is as of the fetch that
	// brought the held record: some of the new records at least.
	h = pollHealth(t, c, stop, 60*time.Second, "holding, with new records as lag", func(h idembroker.Health) bool {
		return h.Holding && h.TotalLag > 0
	})
	if err := h.Ready(); err == nil || !strings.Contains(err.Error(), "holding messages") || !strings.Contains(h.HoldReason, idem.ErrUnavailable.Error()) {
		t.Fatalf("during the outage: Ready() = %v; health %+v", err, h)
	}
	if err := h.Live(time.Now()); err != nil || !h.Connected {
		t.Fatalf("during the outage: Live() = %v, connected %v: want alive and in the group", err, h.Connected)
	}
	var total int64
	for _, l := range h.Lag {
		if l.Committed != 5 || l.HighWatermark <= 5 || l.HighWatermark > n/parts || l.Lag != l.HighWatermark-l.Committed {
			t.Fatalf("partition lag during the outage %+v: want nothing committed past the 5 records before it, and some of the %d after", l, n/parts-5)
		}
		total += l.Lag
	}
	if total != h.TotalLag {
		t.Fatalf("total lag %d, partitions sum to %d", h.TotalLag, total)
	}

	proxy.Restore()
	wait(t, cms.done, 60*time.Second, "every partition committed after the outage")
	h = pollHealth(t, c, stop, 30*time.Second, "ready with no lag", func(h idembroker.Health) bool {
		return h.Ready() == nil && h.TotalLag == 0
	})
	if !h.LastSuccess.After(h.Started) {
		t.Fatalf("after the outage: %+v", h)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if h := c.Health(); h.Running || h.Connected || h.Ready() == nil {
		t.Fatalf("after Run: %+v", h)
	}
}

// A database away when Run starts is a hold from the first moment, and
// ends when the database answers, with no record to apply.
func TestHealthHoldsWhileTheDatabaseIsAwayAtStart(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.topic(t, "health-start", 1)
	group := k.group("health-start")
	d := newDB(t)
	store, proxy := d.throughProxy(t)
	out := newOutcomes()
	cms := newCommits(t, ends(1, 1))
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), outageProcessor(t, store, out), &idemkafka.Config{
		Hooks:         []idem.Hook{cms},
		CommitTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	proxy.Stop()
	stop := run(t, c)
	h := pollHealth(t, c, stop, 30*time.Second, "holding at start", func(h idembroker.Health) bool { return h.Holding })
	if err := h.Ready(); err == nil || !strings.Contains(err.Error(), "holding") {
		t.Fatalf("database away at start: Ready() = %v", err)
	}
	proxy.Restore()
	pollHealth(t, c, stop, 30*time.Second, "ready on an idle topic", func(h idembroker.Health) bool { return h.Ready() == nil })
	produce(t, k.client(t), topic, 1, 0, 1, msgID)
	wait(t, cms.done, 60*time.Second, "the record committed")
	pollHealth(t, c, stop, 30*time.Second, "the record settled", func(h idembroker.Health) bool { return !h.LastSuccess.IsZero() && h.Ready() == nil })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
