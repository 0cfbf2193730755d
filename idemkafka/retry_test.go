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
	"github.com/idemkit/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// appliedOrder returns the message IDs of the effects in the order they
// committed.
func (d *db) appliedOrder(t testing.TB) []string {
	t.Helper()
	rows, err := d.pool.Query(context.Background(), `SELECT message_id FROM effects ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// A record that must be retried holds the records after it in its
// partition: none is applied ahead of it, and the ones left untried behind
// it do not spend their own budget.
func TestRetryKeepsPartitionOrder(t *testing.T) {
	t.Parallel()
	const n = 6
	k := newKafka(t)
	topic := k.topic(t, "order", 1)
	group := k.group("order")
	produce(t, k.client(t), topic, 1, 0, n, msgID)
	d := newDB(t)
	if _, err := d.pool.Exec(context.Background(), `ALTER TABLE effects ADD COLUMN seq bigserial`); err != nil {
		t.Fatal(err)
	}
	// evt-1 and evt-2 fail on their first run and succeed on the next.
	var mu sync.Mutex
	flaky := map[string]int{msgID(1): 0, msgID(2): 0}
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		mu.Lock()
		n, ok := flaky[m.ID]
		flaky[m.ID] = n + 1
		mu.Unlock()
		if ok && n == 0 {
			return fmt.Errorf("%s: downstream busy", m.ID)
		}
		return write(ctx, tx, m)
	}
	out := newOutcomes()
	hooks := newCommits(t, map[int32]int64{0: n})
	// The processor's budget is two runs (see db.processor): evt-2 fails
	// once on its own; had it been charged for waiting behind evt-1, it
	// would be dead-lettered.
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, out, handler), &idemkafka.Config{Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, hooks.done, 60*time.Second, "the partition committed to its end")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := make([]string, n)
	for i := range want {
		want[i] = msgID(i)
	}
	if got := d.appliedOrder(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("applied in order %v, want %v", got, want)
	}
	if dl, a := out.get(idem.DeadLettered), out.get(idem.Applied); dl != 0 || a != n || len(hooks.dl) != 0 {
		t.Errorf("%d dead-lettered (%d dead letters produced), %d applied; want 0 and %d applied", dl, len(hooks.dl), a, n)
	}
}

// retries signals once records were run again n times in all, for outage
// tests.
type retries struct {
	n      atomic.Int64
	mu     sync.Mutex
	wanted int64
	reach  chan struct{}
}

// reached is closed once records were run again n more times.
func (h *retries) reached(n int64) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wanted, h.reach = h.n.Load()+n, make(chan struct{})
	return h.reach
}

func (h *retries) count() {
	n := h.n.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.reach != nil && n >= h.wanted {
		close(h.reach)
		h.reach = nil
	}
}

// holdHooks are commits and retries.
type holdHooks struct {
	*commits
	holds retries
}

func newHolds(c *commits) *holdHooks { return &holdHooks{commits: c} }

func (h *holdHooks) OnRetry(*kgo.Record, int, idem.Result) { h.holds.count() }

// outageProcessor is a processor over store (the schema reached through a
// proxy) that waits 100ms for an unreachable database before it hands the
// record back, with a budget of 2 runs.
func outageProcessor(t testing.TB, store idemstore.Store[pgx.Tx], out idem.OutcomeHook) *idem.Processor[pgx.Tx] {
	t.Helper()
	proc, err := idem.NewProcessor[pgx.Tx](store, &idem.Config[pgx.Tx]{
		Consumer: "kafka-test", Key: idem.ByMessageID, Handler: write, Hooks: []idem.Hook{out}, Logger: testLogger,
		Retry: idem.RetryPolicy{MaxAttempts: 2, Backoff: idem.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
			WaitUnavailable: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	return proc
}

// A real database outage (a proxy that stops answering: open connections
// cut, new ones time out after connect_timeout=1) far longer than a
// record's budget dead-letters nothing: the records are held, without
// spending their attempts, and once the database answers again every
// record is applied once.
func TestOutageSpendsNoAttempts(t *testing.T) {
	t.Parallel()
	const n, parts = 40, 2
	k := newKafka(t)
	topic := k.topic(t, "outage", parts)
	group := k.group("outage")
	prod := k.client(t)
	d := newDB(t)
	store, proxy := d.throughProxy(t)
	out := newOutcomes()
	hooks := newHolds(newCommits(t, ends(n, parts)))
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), outageProcessor(t, store, out), &idemkafka.Config{
		MaxBatch: 5,
		Hooks:    []idem.Hook{hooks},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	produce(t, prod, topic, parts, 0, 10, msgID)
	wait(t, hooks.reached(ends(10, parts)), 30*time.Second, "the first records committed before the outage")
	// The consumer is idle: the outage starts between transactions.
	proxy.Stop()
	held := hooks.holds.reached(4)
	produce(t, prod, topic, parts, 10, n-10, msgID)
	wait(t, held, 60*time.Second, "records held during the outage")
	proxy.Restore()
	wait(t, hooks.done, 60*time.Second, "every partition committed after the outage")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	s := c.Stats()
	if dl, a := out.get(idem.DeadLettered), out.get(idem.Applied); dl != 0 || a != n || s.DeadLettered != 0 {
		t.Errorf("%d dead-lettered (%d dead letters produced), %d applied; want 0 and %d applied", dl, s.DeadLettered, a, n)
	}
	if s.Held < 4 {
		t.Errorf("stats %+v: want at least 4 holds", s)
	}
	t.Logf("outage: records held %d times, budget 2; stats %+v", hooks.holds.n.Load(), s)
}

// An outage that does not end holds the partitions, not the shutdown:
// cancelling Run returns promptly, with nothing dead-lettered and no offset
// committed past the records that were never applied.
func TestOutageEndsWithShutdown(t *testing.T) {
	t.Parallel()
	const n, parts = 10, 2
	k := newKafka(t)
	topic := k.topic(t, "outage-stop", parts)
	group := k.group("outage-stop")
	d := newDB(t)
	store, proxy := d.throughProxy(t)
	out := newOutcomes()
	hooks := newHolds(newCommits(t, ends(n, parts)))
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), outageProcessor(t, store, out), &idemkafka.Config{Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	// Run checked the inbox at start and applied the first records; now
	// the database goes away.
	prod := k.client(t)
	produce(t, prod, topic, parts, 0, parts, msgID)
	wait(t, hooks.reached(ends(parts, parts)), 30*time.Second, "the first records committed before the outage")
	proxy.Stop()
	held := hooks.holds.reached(2)
	produce(t, prod, topic, parts, parts, n, msgID)
	wait(t, held, 60*time.Second, "records held during the outage")
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Run took %v to return after cancel during an outage", took)
	}
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	if s := c.Stats(); s.DeadLettered != 0 || out.get(idem.DeadLettered) != 0 || out.get(idem.Applied) != parts || fmt.Sprint(hooks.last) != fmt.Sprint(ends(parts, parts)) {
		t.Errorf("during the outage: %d dead letters, %d dead-lettered, %d applied, commits %v; want none but the first",
			s.DeadLettered, out.get(idem.DeadLettered), out.get(idem.Applied), hooks.log)
	}
}

// A FaultFunc may block: the partition it holds waits with its offset
// uncommitted while the other partition commits, and it goes on once the
// FaultFunc returns.
func TestBlockingFaultHoldsOnlyItsPartition(t *testing.T) {
	t.Parallel()
	const n, parts = 20, 2
	k := newKafka(t)
	topic := k.topic(t, "hold", parts)
	group := k.group("hold")
	produce(t, k.client(t), topic, parts, 0, n, msgID)
	d := newDB(t)
	hooks := newCommits(t, ends(n, parts))
	release, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, nil, nil), &idemkafka.Config{
		Hooks: []idem.Hook{hooks},
		Faults: func(ctx context.Context, _ idem.FaultPoint, _ string, partition int32, _ int64) error {
			if partition != 0 {
				return nil
			}
			once.Do(func() { close(held) })
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, held, 30*time.Second, "partition 0 to reach its offset commit")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		hooks.mu.Lock()
		p1, p0 := hooks.last[1], fmt.Sprint(hooks.log[0])
		hooks.mu.Unlock()
		if p0 != "[]" {
			t.Fatalf("partition 0 committed %s while its FaultFunc blocked", p0)
		}
		if p1 == n/parts {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 1 committed up to %d while partition 0 was held, want %d", p1, n/parts)
		}
	}
	close(release)
	wait(t, hooks.done, 30*time.Second, "both partitions committed once released")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
}

// A connection that goes silent under the handler (half-open: the proxy
// freezes, nothing is cut) is an outage too: the processor's transaction
// deadline ends the try, the record is held, and nothing reaches the
// dead-letter topic; once the database answers again every record is
// applied once.
func TestHalfOpenConnectionUnderHandler(t *testing.T) {
	t.Parallel()
	const n, parts = 12, 2
	k := newKafka(t)
	topic := k.topic(t, "halfopen", parts)
	d := newDB(t)
	store, proxy := d.throughProxy(t)
	out := newOutcomes()
	hooks := newHolds(newCommits(t, ends(n, parts)))
	var once sync.Once
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if m.ID == msgID(5) {
			once.Do(proxy.Freeze) // the effect's INSERT below never gets an answer
		}
		return write(ctx, tx, m)
	}
	proc, err := idem.NewProcessor[pgx.Tx](store, &idem.Config[pgx.Tx]{
		Consumer: "kafka-test", Key: idem.ByMessageID, Handler: handler, Hooks: []idem.Hook{out}, Logger: testLogger,
		TxTimeout: 500 * time.Millisecond, CommitTimeout: 500 * time.Millisecond,
		Retry: idem.RetryPolicy{MaxAttempts: 2, Backoff: idem.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
			WaitUnavailable: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemkafka.NewConsumer(k.groupClient(t, k.group("halfopen"), []string{topic}), proc, &idemkafka.Config{MaxBatch: 1, Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	held := hooks.holds.reached(4)
	produce(t, k.client(t), topic, parts, 0, n, msgID)
	wait(t, held, 60*time.Second, "records held while the connection is silent")
	proxy.Restore()
	wait(t, hooks.done, 60*time.Second, "every partition committed once the database answers")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	if s := c.Stats(); out.get(idem.DeadLettered) != 0 || s.DeadLettered != 0 {
		t.Errorf("%d dead-lettered, %d dead letters produced; want none (stats %+v)", out.get(idem.DeadLettered), s.DeadLettered, s)
	}
}
