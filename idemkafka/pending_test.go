package idemkafka_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// failures signals when a commit of each partition's end failed.
type failures struct {
	mu   sync.Mutex
	want map[int32]int64
	seen map[int32]bool
	done chan struct{}
}

func newFailures(want map[int32]int64) *failures {
	return &failures{want: want, seen: map[int32]bool{}, done: make(chan struct{})}
}

func (f *failures) OnCommit(_ string, p int32, offset int64, err error) {
	if err == nil || offset != f.want[p] {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[p] = true
	if len(f.seen) == len(f.want) {
		select {
		case <-f.done:
		default:
			close(f.done)
		}
	}
}

// eventually fails the test if cond does not hold within d; it checks
// every 20ms.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; %s", d, what, state())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// groupOffsets returns the group's committed offsets of topic.
func groupOffsets(t *testing.T, k *kafkaEnv, group, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(k.client(t)).FetchOffsets(ctx, group)
	if err != nil {
		t.Logf("fetching the group's offsets: %v", err)
		return nil
	}
	out := map[int32]int64{}
	for p, o := range resp[topic] {
		if o.Err == nil {
			out[p] = o.At
		}
	}
	return out
}

func reachedAll(got, want map[int32]int64) bool {
	for p, end := range want {
		if got[p] != end {
			return false
		}
	}
	return true
}

// The coordinator keeps moving away from the last commit of a partition
// for longer than CommitTimeout, as a coordinator whose broker is down
// would: the commit fails, and nothing more is produced. Once the
// coordinator stays put, the consumer sends the commit again on its own,
// between polls that bring nothing: the group's committed offset reaches
// the partition's end without a new record or a rebalance.
func TestPendingCommitLandsWithoutNewRecords(t *testing.T) {
	t.Parallel()
	const n, parts = 6, 1
	c, k := newKfake(t, 3)
	topic := k.topic(t, "pending", parts)
	group := k.group("pending")
	want := ends(n, parts)

	var mu sync.Mutex
	refusing, refused := true, 0
	c.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		node := c.CurrentNode()
		if c.CoordinatorFor(req.Group) != node {
			return nil, nil, false
		}
		mu.Lock()
		defer mu.Unlock()
		if !refusing || !commitsEnd(req, want) {
			return nil, nil, false
		}
		refused++
		for c.CoordinatorFor(req.Group) == node {
			c.RehashCoordinators()
		}
		return nil, nil, false // the cluster answers NOT_COORDINATOR
	})
	refusedSoFar := func() int {
		mu.Lock()
		defer mu.Unlock()
		return refused
	}

	d := newDB(t)
	proc := d.processor(t, newOutcomes(), nil)
	obs := newCommits(t, want)
	failed := newFailures(want)
	cl := k.groupClient(t, group, []string{topic}, kgo.RequestRetries(1))
	cons, err := idemkafka.NewConsumer(cl, proc, &idemkafka.Config{
		Hooks:          []idem.Hook{obs, failed},
		RebalanceGrace: 500 * time.Millisecond, CommitTimeout: time.Second,
		Backoff: idem.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:  testLogger,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, cons)
	produce(t, k.client(t), topic, parts, 0, n, msgID)
	waitOr(t, failed.done, 60*time.Second, "the last commit failing past CommitTimeout", func() string { return consumerState(cons) })
	_, gen := cl.GroupMetadata()
	after := refusedSoFar()
	// Sent again with no record to process.
	eventually(t, 30*time.Second, "the failed commit sent again", func() bool { return refusedSoFar() >= after+3 },
		func() string { return fmt.Sprintf("refused %d; %s", refusedSoFar(), consumerState(cons)) })

	mu.Lock()
	refusing = false
	mu.Unlock()
	var got map[int32]int64
	eventually(t, 30*time.Second, "the group's committed offset at the partition's end", func() bool {
		got = groupOffsets(t, k, group, topic)
		return reachedAll(got, want)
	}, func() string { return fmt.Sprintf("group committed %v, want %v; %s", got, want, consumerState(cons)) })

	if _, now := cl.GroupMetadata(); now != gen {
		t.Errorf("generation %d, was %d: the commit landed through a rebalance", now, gen)
	}
	h := cons.Health()
	s := cons.Stats()
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	if s.Rebalances != 0 || s.CommitErrors == 0 || s.CommitRetries == 0 || s.Delivered != n {
		t.Errorf("stats %+v: want a failed commit sent again, %d records delivered once, no rebalance", s, n)
	}
	if !h.Connected {
		t.Errorf("health %+v: the polls the consumer ended itself were taken for failures", h)
	}
	for _, l := range h.Lag {
		if l.Lag != 0 {
			t.Errorf("partition %d: lag %d after the commit landed", l.Partition, l.Lag)
		}
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
}

// commitsEnd reports whether req commits some partition at its end in
// want.
func commitsEnd(req *kmsg.OffsetCommitRequest, want map[int32]int64) bool {
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			if p.Offset == want[p.Partition] {
				return true
			}
		}
	}
	return false
}

// The coordinator refuses the last commits of member A (NOT_COORDINATOR,
// as a coordinator moving away answers), which keeps sending them again.
// Member B joins and takes one of A's partitions: A never sends a commit
// of that partition after it was revoked, while it goes on sending the
// one of the partition it kept, which lands once the coordinator takes
// A's commits. No committed offset moves backwards.
func TestPendingCommitNotSentAfterRevoke(t *testing.T) {
	t.Parallel()
	const n, parts = 10, 2
	c, k := newKfake(t, 1)
	topic := k.topic(t, "pendrevoke", parts)
	group := k.group("pendrevoke")
	want := ends(n, parts)

	var mu sync.Mutex
	var memberA string
	refusing := true
	revoked := map[int32]bool{}
	sends := map[int32]int{}       // A's commits of its partitions' ends
	afterRevoke := map[int32]int{} // A's commits of a partition after its revoke
	c.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		mu.Lock()
		defer mu.Unlock()
		if memberA == "" || req.MemberID != memberA {
			return nil, nil, false
		}
		for _, t := range req.Topics {
			for _, p := range t.Partitions {
				if revoked[p.Partition] {
					afterRevoke[p.Partition]++
				}
				if p.Offset == want[p.Partition] {
					sends[p.Partition]++
				}
			}
		}
		if !refusing || !commitsEnd(req, want) {
			return nil, nil, false
		}
		return refuse(req, kerr.NotCoordinator.Code), nil, true
	})
	state := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("revoked %v, sends %v, after revoke %v", revoked, sends, afterRevoke)
	}

	d := newDB(t)
	obs := newCommits(t, want)
	failed := newFailures(want)
	cfg := func(hooks ...idem.Hook) *idemkafka.Config {
		return &idemkafka.Config{
			Hooks:          hooks,
			RebalanceGrace: 500 * time.Millisecond, CommitTimeout: time.Second,
			Backoff: idem.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
			Logger:  testLogger,
		}
	}
	joinedA := make(chan struct{})
	var joinOnce sync.Once
	revoke := func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range m[topic] {
			revoked[p] = true
		}
	}
	clA := k.groupClient(t, group, []string{topic}, kgo.RequestRetries(1),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if len(m[topic]) == parts {
				joinOnce.Do(func() { close(joinedA) })
			}
		}),
		kgo.OnPartitionsRevoked(revoke), kgo.OnPartitionsLost(revoke))
	consA, err := idemkafka.NewConsumer(clA, d.processor(t, newOutcomes(), nil), cfg(obs, failed))
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, consA)
	wait(t, joinedA, 30*time.Second, "A assigned every partition")
	mu.Lock()
	memberA, _ = clA.GroupMetadata()
	mu.Unlock()

	produce(t, k.client(t), topic, parts, 0, n, msgID)
	waitOr(t, failed.done, 60*time.Second, "A's last commits failing past CommitTimeout", func() string { return consumerState(consA) })
	mu.Lock()
	before := map[int32]int{}
	for p, s := range sends {
		before[p] = s
	}
	mu.Unlock()
	eventually(t, 30*time.Second, "A sending its failed commits again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for p := range want {
			if sends[p] < before[p]+2 {
				return false
			}
		}
		return true
	}, state)

	// B joins; cooperative-sticky gives it one of A's partitions.
	assignedB := make(chan []int32, 4)
	clB := k.groupClient(t, group, []string{topic},
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if len(m[topic]) > 0 {
				assignedB <- m[topic]
			}
		}))
	consB, err := idemkafka.NewConsumer(clB, d.processor(t, newOutcomes(), nil), cfg(obs))
	if err != nil {
		t.Fatal(err)
	}
	stopB := run(t, consB)
	var taken []int32
	select {
	case taken = <-assignedB:
	case <-time.After(30 * time.Second):
		t.Fatalf("B assigned no partition; %s", state())
	}
	if len(taken) != 1 {
		t.Fatalf("B took partitions %v; want one of %d", taken, parts)
	}
	gone := taken[0]
	kept := 1 - gone
	eventually(t, 30*time.Second, "A's revoke of the partition B took", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return revoked[gone]
	}, state)
	// B commits its partition to the end (the records are duplicates).
	wait(t, obs.reached(map[int32]int64{gone: want[gone]}), 30*time.Second, "B committing its partition")
	// A goes on sending the commit of the partition it kept, after the
	// revoke: its re-sends run, without the revoked partition.
	mu.Lock()
	keptSends := sends[kept]
	mu.Unlock()
	eventually(t, 30*time.Second, "A sending the kept partition's commit again after the revoke", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return sends[kept] >= keptSends+3
	}, state)

	mu.Lock()
	if afterRevoke[gone] != 0 {
		t.Errorf("A sent %d commits of partition %d after it was revoked; %v", afterRevoke[gone], gone, revoked)
	}
	refusing = false
	mu.Unlock()
	var got map[int32]int64
	eventually(t, 30*time.Second, "the group's committed offsets at the partitions' ends", func() bool {
		got = groupOffsets(t, k, group, topic)
		return reachedAll(got, want)
	}, func() string { return fmt.Sprintf("group committed %v, want %v; %s", got, want, state()) })
	if err := stopB(); err != nil {
		t.Errorf("B: Run = %v", err)
	}
	if err := stopA(); err != nil {
		t.Errorf("A: Run = %v", err)
	}
	mu.Lock()
	if afterRevoke[gone] != 0 {
		t.Errorf("A sent %d commits of partition %d after it was revoked", afterRevoke[gone], gone)
	}
	mu.Unlock()
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
}

// refuse answers req with code for every partition.
func refuse(req *kmsg.OffsetCommitRequest, code int16) *kmsg.OffsetCommitResponse {
	resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
	resp.Version = req.Version
	for _, t := range req.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}
