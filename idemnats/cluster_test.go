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

// On a 3-node cluster, the leader of an R3 stream stopped between a
// batch's commit and its acks (the consumer's node possibly with it)
// loses nothing, doubles nothing and dead-letters nothing: the survivors
// elect a new leader, the consumer reconnects to one of them, and what
// was not acked comes back as Duplicates.
func TestClusterLeaderLoss(t *testing.T) {
	cl := natstest.StartCluster(t)
	_, js := connect(t, cl.URLs())
	stream := uniqueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, sc := range []jetstream.StreamConfig{
		{Name: stream, Subjects: []string{stream + ".msgs"}, Storage: jetstream.FileStorage, Replicas: 3, MaxAge: testMaxAge},
		{Name: stream + "_DLQ", Subjects: []string{"idem.dlq." + stream}, Storage: jetstream.FileStorage, Replicas: 3, MaxAge: testMaxAge},
	} {
		for {
			_, err := js.CreateStream(ctx, sc)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("creating stream %s: %v", sc.Name, err)
			}
			time.Sleep(100 * time.Millisecond) // the meta leader may still be settling
		}
	}
	d := newDB(t)
	const n = 200
	publish(t, js, stream, "m", n)
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	leader := cl.Server(st.CachedInfo().Cluster.Leader)
	if leader == nil {
		t.Fatalf("stream %s has no leader among the nodes: %+v", stream, st.CachedInfo().Cluster)
	}

	var s settles
	var stopped atomic.Bool
	c, err := idemnats.NewConsumer(d.processor(t, &s), &idemnats.Config{
		URL: cl.URLs(), Stream: stream, BatchSize: 10, AckWait: 6 * time.Second, FetchWait: time.Second,
		Backoff: idem.Backoff{Initial: 50 * time.Millisecond, Max: time.Second}, Logger: quiet,
		Faults: func(_ context.Context, point idem.FaultPoint, _ []idem.Message) error {
			var k int
			if point != idemnats.BeforeSettle || d.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&k) != nil {
				return nil
			}
			if k >= 50 && stopped.CompareAndSwap(false, true) {
				leader.Stop()
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitFor(t, 60*time.Second, "the stream leader stopped after 50 messages committed", stopped.Load)
	waitFor(t, 120*time.Second, "every message applied on the surviving nodes", func() bool { _, k := d.effects(t); return k == n })
	leader.Start()
	if err := stop(); err != nil {
		t.Fatalf("Run = %v; want nil after a shutdown", err)
	}
	rows, distinct := d.effects(t)
	t.Logf("leader %s stopped; stats %+v", leader.Name(), c.Stats())
	if rows != n || distinct != n {
		t.Errorf("%d effects of %d messages; want %d: 0 lost, 0 doubled", rows, distinct, n)
	}
	if got := s.count(idem.DeadLettered) + s.count(idem.Expired); got != 0 || c.Stats().DeadLettered != 0 {
		t.Errorf("%d messages dead-lettered through a leader loss; want none", got)
	}
}
