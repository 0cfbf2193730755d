package idemkafka_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A record whose handler does not return holds its partition, not the
// group: when a second member joins, the first gives up what it has not
// settled within RebalanceGrace (the slow handler's context is cancelled),
// commits nothing past the slow record, and rejoins; the new member owns
// partitions while the slow record still holds, and the first member is
// never expelled. Without the give-up the group would wait its whole
// rebalance timeout, here minutes (with a session longer still), for a
// member that does not rejoin: the new member would own nothing within the
// test's deadline, and the first would lose its partitions. Once the
// handler lets go, the slow record is applied once by whoever owns its
// partition. Every step is a signal, none a duration.
func TestRebalanceGivesUpSlowRecord(t *testing.T) {
	t.Parallel()
	const parts = 2
	k := newKafka(t)
	topic := k.topic(t, "slow", parts)
	group := k.group("slow")
	prod := k.client(t)
	// Partition 0: evt-0, slow, evt-2; partition 1: evt-1, evt-3.
	ids := []string{msgID(0), msgID(1), "slow", msgID(3), msgID(2)}
	produce(t, prod, topic, parts, 0, len(ids), func(i int) string { return ids[i] })
	d := newDB(t)
	out := newOutcomes()
	slowStarted, slowCancelled, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var slowRuns atomic.Int32
	var cancelledOnce sync.Once
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if m.ID == "slow" {
			if slowRuns.Add(1) == 1 {
				close(slowStarted)
			}
			select {
			case <-release:
			case <-ctx.Done():
				cancelledOnce.Do(func() { close(slowCancelled) })
				return ctx.Err()
			}
		}
		return write(ctx, tx, m)
	}
	// No transaction deadline: only the give-up cancels the slow handler.
	proc := d.processor(t, out, handler, func(c *idem.Config[pgx.Tx]) { c.TxTimeout = -1 })
	obs := newCommits(t, ends(len(ids), parts))
	// Timeouts far beyond the test's deadlines: only the give-up can let
	// the new member in while the slow record holds.
	long := []kgo.Opt{kgo.SessionTimeout(3 * time.Minute), kgo.RebalanceTimeout(2 * time.Minute)}
	lost := make(chan struct{})
	var lostOnce sync.Once
	aOpts := append(long, kgo.OnPartitionsLost(func(context.Context, *kgo.Client, map[string][]int32) {
		lostOnce.Do(func() { close(lost) })
	}))
	a, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}, aOpts...), proc, &idemkafka.Config{Hooks: []idem.Hook{obs}, MaxBatch: 1, RebalanceGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, a)
	wait(t, slowStarted, 60*time.Second, "the slow record to start")

	assigned := make(chan struct{})
	var once atomic.Bool
	bOpts := append(long, kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		for _, ps := range m {
			if len(ps) > 0 && once.CompareAndSwap(false, true) {
				close(assigned)
			}
		}
	}))
	b, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}, bOpts...), proc, &idemkafka.Config{Hooks: []idem.Hook{obs}, MaxBatch: 1})
	if err != nil {
		t.Fatal(err)
	}
	stopB := run(t, b)
	waitOr(t, assigned, 60*time.Second, "the new member to own partitions while the slow record holds", func() string {
		return fmt.Sprintf("slow record ran %d times, its context cancelled: %v; first member: %s; second member: %s",
			slowRuns.Load(), closed(slowCancelled), consumerState(a), consumerState(b))
	})
	// The group went on because the first member gave up, not because it
	// waited out a member: the slow handler was cancelled before the new
	// member got its partitions, and the first member kept its place.
	if !closed(slowCancelled) {
		t.Errorf("the new member owns partitions, but the slow record's handler was never cancelled")
	}
	if closed(lost) {
		t.Errorf("the first member lost its partitions (expelled from the group) instead of giving up the slow record")
	}
	obs.mu.Lock()
	p0 := obs.last[0]
	obs.mu.Unlock()
	if p0 > 1 {
		t.Errorf("partition 0 committed up to %d, past the slow record at offset 1", p0)
	}
	close(release)
	waitOr(t, obs.done, 60*time.Second, "every partition committed once the slow record let go", func() string {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return fmt.Sprintf("commits %v; slow record ran %d times; first member: %s; second member: %s",
			obs.log, slowRuns.Load(), consumerState(a), consumerState(b))
	})
	if err := stopB(); err != nil {
		t.Errorf("second member's Run = %v", err)
	}
	if err := stopA(); err != nil {
		t.Errorf("first member's Run = %v", err)
	}
	if rows, distinct := d.effects(t); rows != len(ids) || distinct != len(ids) {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, len(ids))
	}
	sa := a.Stats()
	if sa.Rebalances == 0 || sa.GivenUp == 0 || sa.DeadLettered+b.Stats().DeadLettered != 0 {
		t.Errorf("first member's stats %+v: want a rebalance, records given up, no dead letter", sa)
	}
	t.Logf("slow record ran %d times; first member %+v", slowRuns.Load(), sa)
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A database outage holds the records, not the group: a member that joins
// during the outage owns partitions well within the rebalance timeout,
// nothing is dead-lettered, and every record is applied once the database
// answers again.
func TestRebalanceDuringOutage(t *testing.T) {
	t.Parallel()
	const n, parts = 8, 2
	k := newKafka(t)
	topic := k.topic(t, "outage-rb", parts)
	group := k.group("outage-rb")
	prod := k.client(t)
	d := newDB(t)
	store, proxy := d.throughProxy(t)
	out := newOutcomes()
	proc := outageProcessor(t, store, out)
	hooks := newHolds(newCommits(t, ends(n, parts)))
	a, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc, &idemkafka.Config{Hooks: []idem.Hook{hooks}, RebalanceGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, a)
	produce(t, prod, topic, parts, 0, parts, msgID)
	wait(t, hooks.reached(ends(parts, parts)), 30*time.Second, "the first records committed")
	proxy.Stop()
	held := hooks.holds.reached(2)
	produce(t, prod, topic, parts, parts, n-parts, msgID)
	wait(t, held, 30*time.Second, "records held during the outage")

	assigned := make(chan struct{})
	var once atomic.Bool
	bOpts := []kgo.Opt{kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		for _, ps := range m {
			if len(ps) > 0 && once.CompareAndSwap(false, true) {
				close(assigned)
			}
		}
	})}
	b, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}, bOpts...), proc, &idemkafka.Config{Hooks: []idem.Hook{hooks}, RebalanceGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopB := run(t, b)
	wait(t, assigned, 6*time.Second, "the new member to own partitions within the rebalance timeout")
	proxy.Restore()
	wait(t, hooks.done, 60*time.Second, "every partition committed once the database answers")
	if err := stopB(); err != nil {
		t.Errorf("second member's Run = %v", err)
	}
	if err := stopA(); err != nil {
		t.Errorf("first member's Run = %v", err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	if dl := out.get(idem.DeadLettered); dl != 0 || a.Stats().DeadLettered+b.Stats().DeadLettered != 0 {
		t.Errorf("%d dead-lettered during the outage; want none", dl)
	}
	if a.Stats().Rebalances == 0 {
		t.Errorf("first member's stats %+v: want the rebalance counted", a.Stats())
	}
}
