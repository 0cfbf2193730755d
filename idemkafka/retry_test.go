package idemkafka_test

import (
	"context"
	"errors"
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
	// evt-1 and evt-2 fail on their first delivery, whatever the processor
	// retries inside it, and succeed on the next.
	flaky := map[string]bool{msgID(1): true, msgID(2): true}
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if flaky[m.ID] && m.Attempt == 1 {
			return fmt.Errorf("%s: downstream busy", m.ID)
		}
		return write(ctx, tx, m)
	}
	out := newOutcomes()
	hooks := newCommits(t, map[int32]int64{0: n})
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, out, handler), &idemkafka.Config{
		// Two tries: evt-2 fails once on its own; had it been charged for
		// waiting behind evt-1, it would be dead-lettered.
		MaxAttempts:    2,
		InitialBackoff: time.Millisecond,
		MaxBackoff:     5 * time.Millisecond,
		Hooks:          hooks,
	})
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

// errDown is the injected "database unreachable" error.
var errDown = errors.New("injected: connection refused")

// downStore is the test's PostgreSQL store whose Begin fails with an
// unavailable-class error for the next down calls.
type downStore struct {
	idem.Store[pgx.Tx]
	down   atomic.Int64
	failed atomic.Int64
}

func (s *downStore) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.down.Add(-1) >= 0 {
		s.failed.Add(1)
		return nil, errDown
	}
	return s.Store.Begin(ctx)
}

func (s *downStore) Classify(err error) idem.ErrorClass {
	if errors.Is(err, errDown) {
		return idem.ClassUnavailable
	}
	return s.Store.Classify(err)
}

// maxRun remembers the highest run any record was retried to.
type maxRun struct {
	*commits
	max atomic.Int64
}

func (h *maxRun) OnRetry(_ *kgo.Record, run int, _ idem.Result) {
	for {
		m := h.max.Load()
		if int64(run) <= m || h.max.CompareAndSwap(m, int64(run)) {
			return
		}
	}
}

// outage returns a processor over d whose database is unreachable for the
// next down transactions; the processor waits 20ms for it per run.
func (d *db) outage(t testing.TB, out idem.Observer, down int64) (*idem.Processor[pgx.Tx], *downStore) {
	t.Helper()
	store := &downStore{Store: d.store}
	store.down.Store(down)
	proc, err := idem.NewProcessor[pgx.Tx](store, &idem.Config[pgx.Tx]{
		Consumer: "kafka-test", Key: idem.ByMessageID, Handler: write, Observer: out, Logger: testLogger,
		Retry: idem.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
			WaitUnavailable: 20 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	return proc, store
}

// A database outage far longer than a record's budget dead-letters
// nothing: the runs that end in ErrUnavailable (and the records left
// untried behind them) do not count against MaxAttempts, and once the
// database is back every record is applied once.
func TestOutageSpendsNoAttempts(t *testing.T) {
	t.Parallel()
	const n, parts = 40, 2
	k := newKafka(t)
	topic := k.topic(t, "outage", parts)
	group := k.group("outage")
	produce(t, k.client(t), topic, parts, 0, n, msgID)
	d := newDB(t)
	out := newOutcomes()
	const down = 150 // failed Begins: some 25 runs of 20ms, against a budget of 2
	proc, store := d.outage(t, out, down)
	hooks := &maxRun{commits: newCommits(t, ends(n, parts))}
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc, &idemkafka.Config{
		MaxAttempts:    2,
		MaxBatch:       5,
		InitialBackoff: 5 * time.Millisecond,
		MaxBackoff:     20 * time.Millisecond,
		Hooks:          hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, hooks.done, 60*time.Second, "every partition committed after the outage")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if f := store.failed.Load(); f != down {
		t.Fatalf("the outage failed %d transactions, want %d", f, down)
	}
	if m := hooks.max.Load(); m <= 2 {
		t.Errorf("no record was run more than %d times: the outage did not outlast the budget of 2", m)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	if dl, a := out.get(idem.DeadLettered), out.get(idem.Applied); dl != 0 || a != n || len(hooks.dl) != 0 {
		t.Errorf("%d dead-lettered (%d dead letters produced), %d applied; want 0 and %d applied", dl, len(hooks.dl), a, n)
	}
	t.Logf("outage: %d failed transactions, records run up to %d times, budget 2", store.failed.Load(), hooks.max.Load())
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
	produce(t, k.client(t), topic, parts, 0, n, msgID)
	d := newDB(t)
	out := newOutcomes()
	proc, store := d.outage(t, out, 1<<40)
	hooks := &maxRun{commits: newCommits(t, ends(n, parts))}
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc, &idemkafka.Config{
		MaxAttempts:    2,
		InitialBackoff: 5 * time.Millisecond,
		MaxBackoff:     20 * time.Millisecond,
		Hooks:          hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	for deadline := time.Now().Add(15 * time.Second); hooks.max.Load() <= 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("records ran at most %d times in 15s of outage", hooks.max.Load())
		}
	}
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Run took %v to return after cancel during an outage", took)
	}
	if store.failed.Load() == 0 {
		t.Error("the outage failed no transaction")
	}
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	if len(hooks.dl) != 0 || out.get(idem.DeadLettered) != 0 || out.get(idem.Applied) != 0 || len(hooks.log) != 0 {
		t.Errorf("during the outage: %d dead letters, %d dead-lettered, %d applied, commits %v; want none",
			len(hooks.dl), out.get(idem.DeadLettered), out.get(idem.Applied), hooks.log)
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
		Hooks: hooks,
		Faults: func(ctx context.Context, _ idemkafka.FaultPoint, _ string, partition int32, _ int64) error {
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
