package idemkafka_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestNewConsumerRefusesUnsafeClient(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	proc := d.processor(t, nil, nil)
	cases := map[string][]kgo.Opt{
		"no group":          {kgo.ConsumeTopics("t")},
		"auto-commit":       {kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.BlockRebalanceOnPoll()},
		"rebalance unblock": {kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.DisableAutoCommit()},
	}
	for name, opts := range cases {
		cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers("127.0.0.1:1"))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if _, err := idemkafka.NewConsumer(cl, proc, nil); !errors.Is(err, idemkafka.ErrClientUnsafe) {
			t.Errorf("%s: NewConsumer error = %v, want ErrClientUnsafe", name, err)
		}
	}
	cl, err := kgo.NewClient(append(idemkafka.GroupOptions("g", "t"), kgo.SeedBrokers("127.0.0.1:1"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := idemkafka.NewConsumer(cl, proc, nil); err != nil {
		t.Errorf("NewConsumer with GroupOptions: %v", err)
	}
	// The default rebalance timeout is 60s: a grace of 40s could hold a
	// rebalance past it.
	if _, err := idemkafka.NewConsumer(cl, proc, &idemkafka.Config{RebalanceGrace: 40 * time.Second}); !errors.Is(err, idemkafka.ErrConfig) {
		t.Errorf("NewConsumer with a rebalance grace of 40s: %v, want ErrConfig", err)
	}
	// Without the rebalance signal a drain could hold the rebalance.
	own, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if _, err := idemkafka.NewConsumer(own, proc, nil); !errors.Is(err, idemkafka.ErrClientUnsafe) {
		t.Errorf("NewConsumer without the rebalance signal: %v, want ErrClientUnsafe", err)
	}
	// A dead letter must be durable before the offset moves past it.
	for name, acks := range map[string]kgo.Acks{"no acks": kgo.NoAck(), "leader ack": kgo.LeaderAck()} {
		dlq, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.RequiredAcks(acks), kgo.DisableIdempotentWrite())
		if err != nil {
			t.Fatal(err)
		}
		defer dlq.Close()
		if _, err := idemkafka.NewConsumer(cl, proc, &idemkafka.Config{DeadLetterClient: dlq}); !errors.Is(err, idemkafka.ErrClientUnsafe) {
			t.Errorf("NewConsumer with a dead-letter producer with %s: %v, want ErrClientUnsafe", name, err)
		}
	}
}

// A consumer that dies after its database commit and before its offset
// commit leaves records that a new member gets again: each effect still
// happens once, and the redelivered records are counted as duplicates.
func TestCrashAfterDatabaseCommitBeforeOffsetCommit(t *testing.T) {
	t.Parallel()
	const n, parts = 1200, 3
	k := newKafka(t)
	topic := k.topic(t, "crash", parts)
	group := k.group("crash")
	produce(t, k.client(t), topic, parts, 0, n, msgID)
	d := newDB(t)
	obs := newCommits(t, ends(n, parts))
	out := newOutcomes()
	proc := d.processor(t, out, nil)

	var commitsSeen atomic.Int32
	a, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc, &idemkafka.Config{
		MaxBatch: 100,
		Hooks:    []idem.Hook{obs},
		Faults: func(_ context.Context, p idem.FaultPoint, _ string, _ int32, _ int64) error {
			if p == idemkafka.BeforeOffsetCommit && commitsSeen.Add(1) == 4 {
				return errors.New("kill -9")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := a.Run(ctx); !errors.Is(err, idemkafka.ErrCrashed) {
		t.Fatalf("Run of the crashing member = %v, want ErrCrashed", err)
	}
	applied := out.get(idem.Applied)
	if applied == 0 || applied == n {
		t.Fatalf("the crash came after %d of %d effects; the test needs a crash in the middle", applied, n)
	}

	b, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc, &idemkafka.Config{MaxBatch: 100, Hooks: []idem.Hook{obs}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, b)
	wait(t, obs.done, 60*time.Second, "the new member to commit every partition")
	if err := stop(); err != nil {
		t.Fatalf("Run of the new member: %v", err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	if got := out.get(idem.Applied); got != n {
		t.Errorf("applied %d, want %d", got, n)
	}
	if dups := out.get(idem.Duplicate); dups == 0 {
		t.Error("no duplicates counted: the crash window redelivered nothing")
	} else {
		t.Logf("crash after commit: %d records redelivered and skipped as duplicates", dups)
	}
}

// Members join and leave (1 → 3 → 1) while records flow: every effect once,
// and no partition's committed offset ever moves backwards, as the members
// report their commits and as the broker reports them.
func TestRebalanceStorm(t *testing.T) {
	t.Parallel()
	rebalanceStorm(t, idemkafka.PositionsOff)
}

// The storm with positions recorded: the same, and every partition's
// recorded position reaches its end.
func TestRebalanceStormWithPositions(t *testing.T) {
	t.Parallel()
	rebalanceStorm(t, idemkafka.PositionsRewind)
}

func rebalanceStorm(t *testing.T, positions idemkafka.Positions) {
	n := 20000
	if testing.Short() {
		n = 4000
	}
	const parts = 6
	k := newKafka(t)
	topic := k.topic(t, "storm", parts)
	group := k.group("storm")
	d := newDB(t)
	obs := newCommits(t, ends(n, parts))
	out := newOutcomes()
	proc := d.processor(t, out, nil)
	member := func(h idem.Hook, opts ...kgo.Opt) *idemkafka.Consumer[pgx.Tx] {
		c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}, opts...), proc, &idemkafka.Config{MaxBatch: 200, Hooks: []idem.Hook{h}, Positions: positions})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// The broker's view, polled independently of the members.
	adm := kadm.NewClient(k.client(t))
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watched := make(chan int)
	go func() {
		last, polls := map[int32]int64{}, 0
		defer func() { watched <- polls }()
		for watchCtx.Err() == nil {
			offs, err := adm.FetchOffsets(watchCtx, group)
			if err == nil {
				polls++
				offs.Each(func(o kadm.OffsetResponse) {
					if o.Err == nil && o.At < last[o.Partition] {
						t.Errorf("broker: committed offset of partition %d moved backwards: %d after %d", o.Partition, o.At, last[o.Partition])
					}
					last[o.Partition] = max(last[o.Partition], o.At)
				})
			}
			time.Sleep(20 * time.Millisecond) // sampling rate of an observer, not a synchronization
		}
	}()

	prod := k.client(t)
	chunk := n / 20
	next := 0
	produceChunks := func(upTo int) {
		for ; next < upTo; next += chunk {
			produce(t, prod, topic, parts, next, chunk, msgID)
		}
	}

	// 1 member.
	produceChunks(n / 4)
	stop1 := run(t, member(obs))
	wait(t, out.reached(idem.Applied, n/8), 60*time.Second, "the first member to make progress")
	// 3 members: each must own partitions and commit before the storm goes
	// on. Records keep flowing while the group rebalances; the test waits
	// for the signals of the group (both new members own partitions), never
	// for a time or a number of records: how long a rebalance takes depends
	// on the machine's load and on the order the members join in.
	h2, h3 := newMemberHooks(obs), newMemberHooks(obs)
	m2, m3 := member(h2, h2.opts()...), member(h3, h3.opts()...)
	stop2, stop3 := run(t, m2), run(t, m3)
	produceChunks(next + chunk)
	wait(t, h2.assigned, 60*time.Second, "the second member to own partitions")
	wait(t, h3.assigned, 60*time.Second, "the third member to own partitions")
	// Every partition now has an owner that keeps it while the group stays
	// as it is; a chunk gives each of them records, and so a commit.
	produceChunks(next + chunk)
	wait(t, h2.first, 60*time.Second, "the second member's first commit")
	wait(t, h3.first, 60*time.Second, "the third member's first commit")
	// Back to 1: one member dies without committing, one leaves gracefully,
	// while the rest of the records arrive.
	m3.Crash()
	if err := stop3(); !errors.Is(err, idemkafka.ErrCrashed) {
		t.Errorf("crashed member's Run = %v, want ErrCrashed", err)
	}
	produceChunks(next + chunk)
	if err := stop2(); err != nil {
		t.Errorf("leaving member's Run = %v", err)
	}
	produceChunks(n)
	wait(t, obs.done, 90*time.Second, "the last member to commit every partition")
	if err := stop1(); err != nil {
		t.Errorf("last member's Run = %v", err)
	}
	stopWatch()
	if polls := <-watched; polls == 0 {
		t.Error("the broker-side watcher never read the group's offsets")
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	total := 0
	for _, l := range obs.log {
		total += len(l)
	}
	t.Logf("storm: %d records, %d applied, %d duplicates, %d offset commits", n, out.get(idem.Applied), out.get(idem.Duplicate), total)
	if positions != idemkafka.PositionsOff {
		got := d.positions(t, proc, topic)
		for p, end := range ends(n, parts) {
			if got[p] != end {
				t.Errorf("recorded position of partition %d = %d, want its end %d", p, got[p], end)
			}
		}
	}
}

// Resetting the group to the earliest offsets replays everything: the inbox
// turns every record into a duplicate and nothing is applied again.
func TestOffsetResetReplaysWithoutEffects(t *testing.T) {
	t.Parallel()
	const n, parts = 600, 3
	k := newKafka(t)
	topic := k.topic(t, "replay", parts)
	group := k.group("replay")
	produce(t, k.client(t), topic, parts, 0, n, msgID)
	d := newDB(t)
	out := newOutcomes()
	proc := d.processor(t, out, nil)

	consumeAll := func() {
		obs := newCommits(t, ends(n, parts))
		c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc, &idemkafka.Config{Hooks: []idem.Hook{obs}})
		if err != nil {
			t.Fatal(err)
		}
		stop := run(t, c)
		wait(t, obs.done, 60*time.Second, "every partition committed")
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	consumeAll()
	if got := out.get(idem.Applied); got != n {
		t.Fatalf("first pass applied %d, want %d", got, n)
	}

	adm := kadm.NewClient(k.client(t))
	var reset kadm.OffsetsList
	for p := range int32(parts) {
		reset = append(reset, kadm.Offset{Topic: topic, Partition: p, At: 0, LeaderEpoch: -1})
	}
	if err := adm.CommitAllOffsets(context.Background(), group, reset.Offsets()); err != nil {
		t.Fatalf("resetting offsets to earliest: %v", err)
	}
	consumeAll()
	if got := out.get(idem.Applied); got != n {
		t.Errorf("after the replay %d applied in all, want %d (zero new)", got, n)
	}
	if got := out.get(idem.Duplicate); got != n {
		t.Errorf("replay counted %d duplicates, want %d", got, n)
	}
	if rows, _ := d.effects(t); rows != n {
		t.Errorf("effects: %d rows, want %d", rows, n)
	}
}

// The producer published the same event twice (two offsets, two
// partitions): one effect.
func TestSameIDAtTwoOffsets(t *testing.T) {
	t.Parallel()
	const parts = 2
	k := newKafka(t)
	topic := k.topic(t, "twice", parts)
	group := k.group("twice")
	id := func(i int) string { return msgID(i % 5) } // records 0..9 carry 5 IDs
	produce(t, k.client(t), topic, parts, 0, 10, id)
	d := newDB(t)
	out := newOutcomes()
	obs := newCommits(t, ends(10, parts))
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, out, nil), &idemkafka.Config{Hooks: []idem.Hook{obs}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, obs.done, 60*time.Second, "every partition committed")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != 5 || distinct != 5 {
		t.Errorf("effects: %d rows, %d distinct; want 5 of each", rows, distinct)
	}
	if a, dup := out.get(idem.Applied), out.get(idem.Duplicate); a != 5 || dup != 5 {
		t.Errorf("applied %d, duplicates %d; want 5 and 5", a, dup)
	}
}

// readDLQ reads n records from a dead-letter topic.
func readDLQ(t *testing.T, k *kafkaEnv, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := k.client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		f := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d dead letters from %s: %v", len(recs), n, topic, err)
		}
		recs = append(recs, f.Records()...)
	}
	return recs
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// A record without the ID header is bad input: the processor dead-letters
// it, so its observer counts it like any other outcome; it goes to the
// dead-letter topic with its reason, nothing is applied for it, and the
// records after it in its partition are.
func TestRecordWithoutIDIsDeadLettered(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.topic(t, "noid", 1)
	group := k.group("noid")
	prod := k.client(t)
	produce(t, prod, topic, 1, 0, 2, msgID)
	if err := prod.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: []byte("anonymous")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	produce(t, prod, topic, 1, 2, 2, msgID)
	d := newDB(t)
	obs := newCommits(t, map[int32]int64{0: 5})
	out := newOutcomes()
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, out, nil), &idemkafka.Config{Hooks: []idem.Hook{obs}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, obs.done, 60*time.Second, "the partition committed past the record without ID")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, _ := d.effects(t); rows != 4 {
		t.Errorf("effects: %d rows, want 4", rows)
	}
	if dl, a := out.get(idem.DeadLettered), out.get(idem.Applied); dl != 1 || a != 4 {
		t.Errorf("observer counted %d dead-lettered and %d applied; want 1 and 4", dl, a)
	}
	dl := readDLQ(t, k, topic+".dlq", 1)[0]
	if string(dl.Value) != "anonymous" || header(dl, idembroker.HeaderOrigin) != topic+"/0/2" ||
		header(dl, idembroker.HeaderOutcome) != "dead_lettered" ||
		!strings.Contains(header(dl, idembroker.HeaderReason), idem.ErrNoMessageID.Error()) ||
		!strings.Contains(header(dl, idembroker.HeaderReason), idemkafka.DefaultIDHeader) {
		t.Errorf("dead letter = %q with headers %v; want the anonymous record from offset 2, reason %q", dl.Value, dl.Headers, idem.ErrNoMessageID)
	}
}

// A poison record runs idem.RetryPolicy.MaxAttempts times, the one budget
// (the consumer keeps no count of its own; the processor adds at most the
// try of the batch it came in), then lands in the
// dead-letter topic with its headers; while it is retried, the other
// partitions keep flowing, and its own partition flows on after it.
func TestPoisonRecordDeadLetteredPartitionsFlow(t *testing.T) {
	t.Parallel()
	const maxAttempts = 4
	k := newKafka(t)
	topic := k.topic(t, "poison", 2)
	group := k.group("poison")
	prod := k.client(t)
	// Partition 0: evt-0, poison, evt-2. Partition 1 gets its records only
	// once the poison is being retried.
	produce(t, prod, topic, 1, 0, 1, msgID)
	produce(t, prod, topic, 1, 1, 1, func(int) string { return "poison" })
	produce(t, prod, topic, 1, 2, 1, msgID)
	d := newDB(t)
	out := newOutcomes()
	retried, partition1Done := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if m.ID != "poison" {
			return write(ctx, tx, m)
		}
		switch runs.Add(1) {
		case 2:
			close(retried)
		case maxAttempts - 1:
			// A late run waits until partition 1 went through: proof
			// that a retrying partition holds only itself.
			select {
			case <-partition1Done:
			case <-time.After(30 * time.Second):
				t.Error("partition 1 did not flow while partition 0 was retrying")
			}
		}
		return errors.New("downstream says no")
	}
	hooks := &poisonHooks{commits: newCommits(t, map[int32]int64{0: 3, 1: 4}), p1: partition1Done}
	budget := func(c *idem.Config[pgx.Tx]) {
		c.Retry = idem.RetryPolicy{MaxAttempts: maxAttempts, Backoff: idem.Backoff{Initial: 20 * time.Millisecond, Max: 20 * time.Millisecond}}
	}
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, out, handler, budget), &idemkafka.Config{Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, retried, 30*time.Second, "the poison record to be retried")
	for i := 10; i < 14; i++ {
		r := idemkafka.NewRecord(topic, msgID(i), nil, []byte("p1"))
		r.Partition = 1
		if err := prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	wait(t, hooks.commits.done, 60*time.Second, "both partitions committed to their end")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// MaxAttempts runs of its own, and at most one more in the batch it
	// came in (the processor does not charge a record for its batch's
	// shared try).
	n := int(runs.Load())
	if n < maxAttempts || n > maxAttempts+1 {
		t.Errorf("the poison record's handler ran %d times, want MaxAttempts = %d (and at most one batch try)", n, maxAttempts)
	}
	if rows, _ := d.effects(t); rows != 6 {
		t.Errorf("effects: %d rows, want 6 (all but the poison)", rows)
	}
	dl := readDLQ(t, k, topic+".dlq", 1)[0]
	want := map[string]string{
		idemkafka.DefaultIDHeader: "poison",
		idembroker.HeaderConsumer: "kafka-test",
		idembroker.HeaderAttempts: strconv.Itoa(n),
		idembroker.HeaderOrigin:   topic + "/0/1",
		idembroker.HeaderOutcome:  "dead_lettered",
	}
	for key, v := range want {
		if got := header(dl, key); got != v {
			t.Errorf("dead letter header %s = %q, want %q", key, got, v)
		}
	}
	if e := header(dl, idembroker.HeaderReason); !strings.Contains(e, "downstream says no") || !strings.Contains(e, idem.ErrRetriesExhausted.Error()) {
		t.Errorf("dead letter reason header = %q; want the handler's error and %q", e, idem.ErrRetriesExhausted)
	}
	if s := c.Stats(); s.DeadLettered != 1 || s.Applied != 6 || s.Retried != 0 {
		t.Errorf("stats %+v; want 1 dead-lettered, 6 applied, no retry of the consumer's own", s)
	}
}

type poisonHooks struct {
	*commits
	p1 chan struct{}
}

func (h *poisonHooks) OnCommit(topic string, p int32, offset int64, err error) {
	h.commits.OnCommit(topic, p, offset, err)
	if p == 1 && offset == 4 && err == nil {
		close(h.p1)
	}
}

// memberHooks tells when one member first owned partitions and when it
// committed for the first time.
type memberHooks struct {
	*commits
	first    chan struct{}
	once     sync.Once
	assigned chan struct{}
	owns     sync.Once
}

func newMemberHooks(c *commits) *memberHooks {
	return &memberHooks{commits: c, first: make(chan struct{}), assigned: make(chan struct{})}
}

// opts are the member's client options that report its assignments.
func (h *memberHooks) opts() []kgo.Opt {
	return []kgo.Opt{kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		for _, ps := range m {
			if len(ps) > 0 {
				h.owns.Do(func() { close(h.assigned) })
			}
		}
	})}
}

func (h *memberHooks) OnCommit(topic string, p int32, offset int64, err error) {
	h.commits.OnCommit(topic, p, offset, err)
	if err == nil {
		h.once.Do(func() { close(h.first) })
	}
}
