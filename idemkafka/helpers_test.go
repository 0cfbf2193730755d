package idemkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/testrun"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaEnv is one Kafka for one test: a fresh in-process kfake cluster, or
// the real cluster named by IDEM_KAFKA_BROKERS with topics unique to the test.
type kafkaEnv struct {
	brokers []string
	real    bool
	suffix  string
}

func newKafka(t testing.TB) *kafkaEnv {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	env := &kafkaEnv{suffix: hex.EncodeToString(b[:])}
	if s := os.Getenv("IDEM_KAFKA_BROKERS"); s != "" {
		env.brokers, env.real = strings.Split(s, ","), true
		return env
	}
	env.brokers = kafkatest.NewCluster(t, kfake.AllowAutoTopicCreation()).ListenAddrs()
	return env
}

// topic creates a topic with n partitions (and its dead-letter topic) and
// returns its name.
func (e *kafkaEnv) topic(t testing.TB, name string, n int32) string {
	t.Helper()
	name = name + "-" + e.suffix
	cl := e.client(t)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tn := range []string{name, name + ".dlq"} {
		resp, err := adm.CreateTopic(ctx, n, 1, nil, tn)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating topic %s: %v", tn, err)
		}
	}
	return name
}

func (e *kafkaEnv) group(name string) string { return name + "-" + e.suffix }

// client returns a plain client (producer, admin), closed at test end.
func (e *kafkaEnv) client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(e.brokers...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0),
	}, opts...)...)
	if err != nil {
		t.Fatalf("creating client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// groupClient returns a client fit for a Consumer, with the group timeouts
// of package kafkatest (short, so that members that leave or die are
// replaced fast, and a session longer than the rebalance timeout, so that
// a rejoining member is never dropped while it waits).
func (e *kafkaEnv) groupClient(t testing.TB, group string, topics []string, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	timeouts := kafkatest.GroupOptions()
	if e.real {
		timeouts = kafkatest.RealGroupOptions()
	}
	opts := append(idemkafka.GroupOptions(group, topics...), timeouts...)
	return e.client(t, append(opts, extra...)...)
}

// produce writes n records to topic, round-robin over parts partitions, with
// IDs id(i).
func produce(t testing.TB, cl *kgo.Client, topic string, parts int32, from, n int, id func(int) string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recs := make([]*kgo.Record, 0, 1000)
	flush := func() {
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Errorf("producing: %v", err)
		}
		recs = recs[:0]
	}
	for i := from; i < from+n; i++ {
		r := idemkafka.NewRecord(topic, id(i), []byte(fmt.Sprint(i)), []byte(fmt.Sprintf(`{"id":%q}`, id(i))))
		r.Partition = int32(i) % parts
		recs = append(recs, r)
		if len(recs) == cap(recs) {
			flush()
		}
	}
	if len(recs) > 0 {
		flush()
	}
}

func msgID(i int) string { return fmt.Sprintf("evt-%06d", i) }

// outcomes counts the processor's results; it is the test's idem.OutcomeHook.
type outcomes struct {
	mu      sync.Mutex
	n       map[idem.Outcome]int
	waiters []waiter
}

type waiter struct {
	o  idem.Outcome
	n  int
	ch chan struct{}
}

func newOutcomes() *outcomes { return &outcomes{n: make(map[idem.Outcome]int)} }

func (o *outcomes) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[r.Outcome]++
	kept := o.waiters[:0]
	for _, w := range o.waiters {
		if o.n[w.o] >= w.n {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	o.waiters = kept
}

func (o *outcomes) get(out idem.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}

// reached is closed once outcome out was seen n times.
func (o *outcomes) reached(out idem.Outcome, n int) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	ch := make(chan struct{})
	if o.n[out] >= n {
		close(ch)
		return ch
	}
	o.waiters = append(o.waiters, waiter{out, n, ch})
	return ch
}

// commits records every offset commit the consumers report and signals when
// every partition of a topic reached its end. It fails the test if a
// partition's committed offset ever moves backwards, but to where the
// client resumed after it reported the log truncated (a DataLossHook).
type commits struct {
	t    testing.TB
	mu   sync.Mutex
	last map[int32]int64
	// floor is, after a reported truncation, the lowest offset the next
	// commit of the partition may go back to; backwards counts the commits
	// that did.
	floor     map[int32]int64
	backwards map[int32]int
	log       map[int32][]int64
	want      map[int32]int64
	done      chan struct{}
	dl        []idem.Result
	// marks are further ends to signal, see reached.
	marks []mark
}

type mark struct {
	want map[int32]int64
	ch   chan struct{}
}

// reached is closed once every partition in want committed up to its end
// there.
func (c *commits) reached(want map[int32]int64) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := mark{want, make(chan struct{})}
	if c.passed(want) {
		close(m.ch)
	} else {
		c.marks = append(c.marks, m)
	}
	return m.ch
}

func (c *commits) passed(want map[int32]int64) bool {
	for part, end := range want {
		if c.last[part] < end {
			return false
		}
	}
	return true
}

func newCommits(t testing.TB, want map[int32]int64) *commits {
	return &commits{t: t, last: map[int32]int64{}, floor: map[int32]int64{}, backwards: map[int32]int{}, log: map[int32][]int64{}, want: want, done: make(chan struct{})}
}

func (c *commits) OnDataLoss(_ string, p int32, _, resetTo int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.floor[p] = resetTo
}

// rewound reports how many commits of partition p went back after a
// reported truncation.
func (c *commits) rewound(p int32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.backwards[p]
}

func (c *commits) OnCommit(topic string, p int32, offset int64, err error) {
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.last[p]; ok && offset < prev {
		if floor, ok := c.floor[p]; ok && offset >= floor {
			c.backwards[p]++
			delete(c.floor, p)
		} else {
			c.t.Errorf("committed offset of %s/%d moved backwards: %d after %d", topic, p, offset, prev)
		}
	}
	c.last[p] = offset
	c.log[p] = append(c.log[p], offset)
	kept := c.marks[:0]
	for _, m := range c.marks {
		if c.passed(m.want) {
			close(m.ch)
		} else {
			kept = append(kept, m)
		}
	}
	c.marks = kept
	if !c.passed(c.want) {
		return
	}
	select {
	case <-c.done:
	default:
		close(c.done)
	}
}

func (c *commits) OnDeadLetter(_, _ string, r idem.Result, err error) {
	if err == nil {
		c.mu.Lock()
		c.dl = append(c.dl, r)
		c.mu.Unlock()
	}
}

// ends returns the end offset per partition for n records produced
// round-robin over parts partitions from offset 0.
func ends(n int, parts int32) map[int32]int64 {
	m := make(map[int32]int64, parts)
	for i := range n {
		m[int32(i)%parts]++
	}
	return m
}

// testLogger keeps what a person should see (warnings) and drops the
// per-duplicate info lines the replay tests produce by the thousand.
var testLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// db is one test's PostgreSQL schema with the inbox and an effects table
// without any unique constraint, so that an effect applied twice shows.
type db struct {
	url   string // the schema's connection URL
	pool  *pgxpool.Pool
	store *pgxinbox.Store
}

func newDB(t testing.TB) *db {
	t.Helper()
	url := pgtest.Schema(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("migrating inbox: %v", err)
	}
	if _, err = pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL, source text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &db{url: url, pool: pool, store: store}
}

// write is the business effect: one row per applied message.
func write(ctx context.Context, tx pgx.Tx, m idem.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, source) VALUES ($1, $2)`, m.ID, m.Source)
	return err
}

func (d *db) processor(t testing.TB, obs idem.OutcomeHook, h idem.Handler[pgx.Tx], mod ...func(*idem.Config[pgx.Tx])) *idem.Processor[pgx.Tx] {
	t.Helper()
	if h == nil {
		h = write
	}
	cfg := &idem.Config[pgx.Tx]{Consumer: "kafka-test", Key: idem.ByMessageID, Handler: h, Hooks: []idem.Hook{obs}, Logger: testLogger,
		Retry: idem.RetryPolicy{MaxAttempts: 2, Backoff: idem.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}}}
	for _, f := range mod {
		f(cfg)
	}
	p, err := idem.NewProcessor(d.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// effects returns the number of effect rows and of distinct message IDs.
func (d *db) effects(t testing.TB) (rows, distinct int) {
	t.Helper()
	err := d.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&rows, &distinct)
	if err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// run starts c in the background; stop cancels it and returns Run's error.
func run[TTx any](t testing.TB, c *idemkafka.Consumer[TTx]) (stop func() error) {
	t.Helper()
	return testrun.Start(t, c, 60*time.Second)
}

// waitOr is wait that, on a timeout, logs state() first: where the
// consumers stood, for a failure too rare to reproduce at will.
func waitOr(t testing.TB, ch <-chan struct{}, d time.Duration, what string, state func() string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s; %s", d, what, state())
	}
}

// consumerState describes a consumer's client and counters.
func consumerState[TTx any](c *idemkafka.Consumer[TTx]) string {
	cl := c.Client()
	_, gen := cl.GroupMetadata()
	return fmt.Sprintf("generation %d, paused %v, uncommitted %v, committed %v, stats %+v",
		gen, cl.PauseFetchPartitions(nil), cl.UncommittedOffsets(), cl.CommittedOffsets(), c.Stats())
}

// wait fails the test if ch is not closed within d.
func wait(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}
