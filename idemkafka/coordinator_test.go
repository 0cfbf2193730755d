package idemkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// newKfake returns a kfake cluster of nodes brokers and its kafkaEnv, for
// tests that move leaders or coordinators (which a real cluster does not
// do on demand).
func newKfake(t *testing.T, nodes int) (*kfake.Cluster, *kafkaEnv) {
	t.Helper()
	c := kafkatest.NewCluster(t, kfake.NumBrokers(nodes))
	var b [4]byte
	_, _ = rand.Read(b[:])
	return c, &kafkaEnv{brokers: c.ListenAddrs(), suffix: hex.EncodeToString(b[:])}
}

// The group coordinator moves to another broker each time the last commit
// of a partition reaches it, more often than the client retries on its
// own: the broker refuses the commit with NOT_COORDINATOR, and the
// consumer, which still owns the partition, sends it again until it is
// accepted. Without that, the partition's committed offset would stay
// behind its end until the next rebalance.
func TestCommitFollowsMovingCoordinator(t *testing.T) {
	t.Parallel()
	const n, parts, moves = 10, 2, 4
	c, k := newKfake(t, 3)
	topic := k.topic(t, "moving", parts)
	group := k.group("moving")
	want := ends(n, parts)

	// Runs on the cluster's loop, before the cluster handles the request.
	var mu sync.Mutex
	refused := map[int32]int{}
	c.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		node := c.CurrentNode()
		if c.CoordinatorFor(req.Group) != node || len(req.Topics) != 1 || len(req.Topics[0].Partitions) != 1 {
			return nil, nil, false
		}
		p := req.Topics[0].Partitions[0]
		mu.Lock()
		defer mu.Unlock()
		if p.Offset != want[p.Partition] || refused[p.Partition] == moves {
			return nil, nil, false
		}
		refused[p.Partition]++
		for c.CoordinatorFor(req.Group) == node {
			c.RehashCoordinators()
		}
		return nil, nil, false // the cluster answers NOT_COORDINATOR
	})

	d := newDB(t)
	proc := d.processor(t, newOutcomes(), nil)
	obs := newCommits(t, want)
	// Fewer retries of its own than the coordinator moves.
	cl := k.groupClient(t, group, []string{topic}, kgo.RequestRetries(1))
	cons, err := idemkafka.NewConsumer(cl, proc, &idemkafka.Config{
		Hooks: []idem.Hook{obs}, RebalanceGrace: 500 * time.Millisecond, CommitTimeout: 2500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, cons)
	produce(t, k.client(t), topic, parts, 0, n, msgID)
	wait(t, obs.done, 60*time.Second, "every partition committed to its end")
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}

	mu.Lock()
	for p := range int32(parts) {
		if refused[p] != moves {
			t.Errorf("the last commit of partition %d was refused %d times; want %d", p, refused[p], moves)
		}
	}
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	committed, err := kadm.NewClient(k.client(t)).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	for p, end := range want {
		if o, ok := committed.Lookup(topic, p); !ok || o.At != end {
			t.Errorf("partition %d: committed %d, want %d", p, o.At, end)
		}
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	if s := cons.Stats(); s.CommitRetries == 0 || s.CommitErrors != 0 {
		t.Errorf("stats %+v: want commits sent again and none failed", s)
	}
}

// After a leader change the client may move its position back: it asks
// the new leader where the epoch it consumed in ended and, when the answer
// is below what it consumed, takes it as a truncated log (kgo.ErrDataLoss)
// and resumes there. kfake answers so for a leader that has written
// nothing in its new epoch; a real broker does after an unclean leader
// election, and then the records from there on are other records, not yet
// applied. So the consumer commits again from where the client resumed —
// below what it committed before, and never below that — or a next owner
// of the partition would start past records nobody applied. Here the
// records are the same ones, found in the inbox.
func TestRewindAfterDataLossCommitsFromTheResetPosition(t *testing.T) {
	t.Parallel()
	const n, parts = 40, 1
	c, k := newKfake(t, 1)
	topic := k.topic(t, "rewind", parts)
	group := k.group("rewind")
	d := newDB(t)
	out := newOutcomes()
	proc := d.processor(t, out, nil)
	obs := newCommits(t, ends(2*n, parts))
	cons, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc, &idemkafka.Config{Hooks: []idem.Hook{obs}, MaxBatch: 5})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, cons)
	prod := k.client(t)
	produce(t, prod, topic, parts, 0, n, msgID)
	wait(t, obs.reached(ends(n, parts)), 30*time.Second, "the first records committed")
	c.ShufflePartitionLeaders()
	wait(t, out.reached(idem.Duplicate, 5), 30*time.Second, "records fetched again after the leader change")
	produce(t, prod, topic, parts, n, n, msgID)
	wait(t, obs.done, 60*time.Second, "every record committed")
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	if rows, distinct := d.effects(t); rows != 2*n || distinct != 2*n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, 2*n)
	}
	if s := cons.Stats(); s.DataLosses == 0 || obs.rewound(0) == 0 {
		t.Errorf("data losses reported %d, commits from the reset position %d: want the rewind reported and committed from", s.DataLosses, obs.rewound(0))
	}
}
