package idemnats_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/natstest"
)

// A JetStream server stopped and started again in the middle of a stream
// (the consumer's connection lost, its fetches, acks and heartbeats
// failing) loses nothing, doubles nothing and dead-letters nothing: the
// consumer reconnects by itself, and what it had not acked comes back as
// Duplicates. Health shows the connection lost while the server is down.
func TestServerRestartMidStream(t *testing.T) {
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	stream := uniqueName(t)
	createStreams(t, js, stream)
	d := newDB(t)
	const n = 300
	ids := publish(t, js, stream, "m", n)

	var s settles
	// The server goes down between a batch's commit and its acks, once
	// 50 messages committed.
	var stopped atomic.Bool
	c, err := idemnats.NewConsumer(d.processor(t, &s), &idemnats.Config{
		URL: srv.URL(), Stream: stream, BatchSize: 10, AckWait: 4 * time.Second, FetchWait: time.Second,
		Backoff: idem.Backoff{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond}, Logger: quiet,
		Faults: func(_ context.Context, point idem.FaultPoint, _ []idem.Message) error {
			var k int
			if point != idemnats.BeforeSettle || d.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&k) != nil {
				return nil
			}
			if k >= 50 && stopped.CompareAndSwap(false, true) {
				srv.Stop()
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitFor(t, 60*time.Second, "the server stopped after 50 messages committed", stopped.Load)
	waitFor(t, 30*time.Second, "the consumer's health to show the connection lost", func() bool { return !c.Health().Connected })
	_, during := d.effects(t)
	srv.Start()
	waitFor(t, 90*time.Second, "every message applied after the restart", func() bool { _, k := d.effects(t); return k == n })
	if err := stop(); err != nil {
		t.Fatalf("Run = %v; want nil after a shutdown", err)
	}
	rows, distinct := d.effects(t)
	t.Logf("applied %d before the server came back; stats %+v", during, c.Stats())
	if rows != n || distinct != n {
		t.Errorf("%d effects of %d messages; want %d: 0 lost, 0 doubled", rows, distinct, len(ids))
	}
	if got := s.count(idem.DeadLettered) + s.count(idem.Expired); got != 0 {
		t.Errorf("%d messages dead-lettered through a server restart; want none", got)
	}
	if st := c.Stats(); st.DeadLettered != 0 || st.Reconnects == 0 {
		t.Errorf("stats %+v; want no dead letter and a reconnect", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dlq, err := js.Stream(ctx, stream+"_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := dlq.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("dead-letter stream: %v messages (%v); want none", msgs(info), err)
	}
}

func msgs(info *jetstream.StreamInfo) uint64 {
	if info == nil {
		return 0
	}
	return info.State.Msgs
}
