package idemkafka_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemkafka"
)

// A paused consumer (the pause stored beside its inbox) holds its
// partitions: records keep arriving, nothing is applied, committed or
// dead-lettered, and its health says who paused it and why. Resumed, it
// applies every record once and commits to the end.
func TestPausedConsumerHoldsItsPartitions(t *testing.T) {
	t.Parallel()
	const n, parts = 40, 2
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k := newKafka(t)
	topic := k.topic(t, "pause", parts)
	prod := k.client(t)
	d := newDB(t)
	if _, _, err := d.store.Pause(ctx, "kafka-test", "alice", "incident 42"); err != nil {
		t.Fatal(err)
	}
	cms := newCommits(t, ends(n, parts))
	held := &pausedResults{}
	proc := d.processor(t, nil, nil, func(c *idem.Config[pgx.Tx]) { c.Hooks = append(c.Hooks, held) })
	c, err := idemkafka.NewConsumer(k.groupClient(t, k.group("pause"), []string{topic}), proc, &idemkafka.Config{
		MaxBatch: 5, Hooks: []idem.Hook{cms},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	produce(t, prod, topic, parts, 0, n, msgID)
	h := pollHealth(t, c, stop, 60*time.Second, "paused", func(h idembroker.Health) bool { return h.Paused && h.TotalLag > 0 })
	if h.PausedBy != "alice" || h.PauseReason != "incident 42" || h.PausedSince.IsZero() || h.Holding {
		t.Fatalf("paused health: %+v", h)
	}
	// Held records are tried again every PauseHoldDelay: after 20 holds
	// (more than one round of a batch per partition), nothing may have
	// been applied or committed.
	deadline := time.Now().Add(time.Minute)
	for held.n.Load() < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("%d holds in a minute", held.n.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rows, _ := d.effects(t); rows != 0 {
		t.Fatalf("a paused consumer applied %d records", rows)
	}
	cms.mu.Lock()
	committed, letters := len(cms.log[0])+len(cms.log[1]), len(cms.dl)
	cms.mu.Unlock()
	if committed != 0 || letters != 0 {
		t.Fatalf("a paused consumer committed %d offsets and dead-lettered %d records", committed, letters)
	}
	if _, err := d.store.Resume(ctx, "kafka-test", "alice", "fixed"); err != nil {
		t.Fatal(err)
	}
	wait(t, cms.done, 60*time.Second, "every partition committed after the resume")
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	pollHealth(t, c, stop, 30*time.Second, "no longer paused", func(h idembroker.Health) bool { return !h.Paused })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// pausedResults counts the results held because the consumer is paused.
type pausedResults struct{ n atomic.Int64 }

func (h *pausedResults) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	if errors.Is(r.Err, idem.ErrPaused) {
		h.n.Add(1)
	}
}
