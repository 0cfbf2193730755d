package dlq

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"

	"github.com/idemkit/idem/internal/kafkatest"
)

// heldDB is the pool of a replay that is held, once it looked up key's
// marker (its judgment), before its next statement: the way a replay
// waiting on its rate limit, or a slow operator's terminal, lets another
// replay of the same letter run in between.
type heldDB struct {
	DB
	key     string
	judged  chan struct{} // closed once key was looked up
	release chan struct{} // closed by the test
	once    sync.Once
	held    atomic.Bool
}

func newHeldDB(db DB, key string) *heldDB {
	return &heldDB{DB: db, key: key, judged: make(chan struct{}), release: make(chan struct{})}
}

func (h *heldDB) wait(ctx context.Context) error {
	if !h.held.Load() {
		return nil
	}
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *heldDB) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := h.wait(ctx); err != nil {
		return nil, err
	}
	tx, err := h.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &watchedTx{Tx: tx, h: h}, nil
}

func (h *heldDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := h.wait(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return h.DB.Exec(ctx, sql, args...)
}

// watchedTx notices the lookup of the held key's marker.
type watchedTx struct {
	pgx.Tx
	h *heldDB
}

func (t *watchedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.Tx.Query(ctx, sql, args...)
	for _, a := range args {
		if ks, ok := a.([]string); ok && slices.Contains(ks, t.h.key) {
			t.h.once.Do(func() {
				t.h.held.Store(true)
				close(t.h.judged)
			})
		}
	}
	return rows, err
}

// runConsumer runs a consumer of the work queue with a working handler
// until the test ends.
func (e *rabbitEnv) runConsumer() *settled {
	e.t.Helper()
	s := &settled{}
	proc, err := idem.NewProcessor(e.store, &idem.Config[pgx.Tx]{Consumer: e.consumer, Key: idem.ByMessageID,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
			return err
		}})
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: amqpURL(), Queue: e.topo.Queue, BatchSize: 1, Hooks: []idem.Hook{s}})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx)
	}()
	e.t.Cleanup(func() {
		cancel()
		<-done
	})
	return s
}

// waitFor polls cond until it holds, or fails the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

// Two operators replay the same dead letter at the same time (two copies
// of it in the DLQ, one taken by each): the first replay's judgment is
// held between its look at the marker and its retirement, while the
// second retires the marker, sends its copy and the consumer applies it.
// The first then finds the marker it judged gone and refuses: the message
// is applied once more, not twice.
func TestConcurrentReplaysApplyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRabbitEnv(t)
	const id = "inv-77"
	e.poison(id)
	e.publish(invoice(id))
	e.consume(1, false) // applied once: the marker M0 exists
	e.deadLetter(id, e.topo.Queue, time.Now())
	if d := e.settledDepth(e.topo.DeadLetterQueue, 2); d != 2 {
		t.Fatalf("DLQ holds %d, want two copies of %s", d, id)
	}
	s := e.runConsumer()
	held := newHeldDB(e.pool, id)
	slow, err := NewInbox(held, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	sel := Selection{Filter: Filter{IDs: []string{id}}, Apply: true, Limit: 1}
	type outcome struct {
		res Result
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		res, err := Replay(ctx, e.source(), slow, sel, Retirement{By: "alice", Why: "INC-77: issue it once more"})
		first <- outcome{res, err}
	}()
	select {
	case <-held.judged:
	case o := <-first:
		t.Fatalf("the first replay ended before it judged the letter: %+v %v", o.res, o.err)
	case <-time.After(time.Minute):
		t.Fatal("the first replay did not judge the letter within a minute")
	}
	res, err := Replay(ctx, e.source(), e.inbox, sel, Retirement{By: "bob", Why: "INC-77: issue it once more"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 1 || res.Items[0].Retired == nil {
		t.Fatalf("second replay: %+v, want its copy replayed", res)
	}
	waitFor(t, "the consumer to apply the second replay", func() bool { return e.effects(id) == 2 })
	close(held.release)
	var o outcome
	select {
	case o = <-first:
	case <-time.After(time.Minute):
		t.Fatal("the first replay did not end within a minute of its release")
	}
	if o.err != nil && !errors.Is(o.err, ErrNoMarker) {
		t.Fatalf("first replay: %v", o.err)
	}
	// Whatever the first replay sent, the consumer settles it.
	sent := 0
	for _, it := range o.res.Items {
		if it.Sent {
			sent++
		}
	}
	waitFor(t, "the consumer to settle what the replays sent", func() bool { return s.n.Load() >= int64(1+sent) })
	if n := e.effects(id); n != 2 {
		t.Errorf("effects of %s: %d, want 2 (applied, then once more by one replay); first replay: %+v", id, n, o.res.Items)
	}
	if o.err == nil && (o.res.Refused != 1 || o.res.Done != 0) {
		t.Errorf("first replay: %+v, want its copy refused", o.res)
	}
	if m, a := e.markers(); m != 1 || a != 1 {
		t.Errorf("markers %d, audit rows %d; want 1, 1", m, a)
	}
}

// kafkaReplayEnv is a topic whose consumer applied the order id once, and
// whose dead-letter topic holds an earlier copy of it, dead-lettered by a
// broken handler; the consumer runs until the test ends.
type kafkaReplayEnv struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	o       *outcomes
	open    func() *Kafka
	effects func() int
}

func newKafkaReplayEnv(t *testing.T, id string) *kafkaReplayEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	c := kafkatest.NewCluster(t)
	brokers := c.ListenAddrs()
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	topic := "orders-" + hex.EncodeToString(b)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for _, tn := range []string{topic, topic + ".dlq"} {
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, tn); err != nil {
			t.Fatal(err)
		}
	}
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	effects := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// run runs a consumer of the topic until stop is called.
	run := func(broken bool) (o *outcomes, stop func()) {
		t.Helper()
		o = &outcomes{}
		proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
			Consumer: "orders-ship", Key: idem.ByMessageID, Hooks: []idem.Hook{o},
			Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
				if broken {
					return idem.Permanent(errors.New("carrier unknown for order " + m.ID))
				}
				_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
				return err
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		cons, err := idemkafka.New(idemkafka.ClientConfig{Brokers: brokers, Group: "orders-ship", Topics: []string{topic},
			Options: []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond)}}, proc, nil)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- cons.Run(rctx) }()
		return o, func() {
			cancel()
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("consumer: %v", err)
			}
		}
	}
	produce := func() {
		if err := cl.ProduceSync(ctx, idemkafka.NewRecord(topic, id, []byte(id), []byte(`{"order":"`+id+`"}`))).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	open := func() *Kafka {
		k, err := NewKafka(ctx, KafkaConfig{Brokers: brokers, Topic: topic + ".dlq"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k.Close() })
		return k
	}
	peek := open()
	produce()
	_, stop := run(true)
	waitFor(t, "the broken consumer to dead-letter the order", func() bool {
		ls, err := peek.Peek(ctx, 0)
		return err == nil && len(ls) == 1
	})
	stop()
	produce()
	o, stop := run(false)
	t.Cleanup(stop)
	waitFor(t, "the consumer to apply the order", func() bool { return effects() == 1 })
	return &kafkaReplayEnv{ctx: ctx, pool: pool, o: o, open: open, effects: effects}
}

// The same race on a Kafka dead-letter topic, where two replays read the
// same letter: the replay held between its judgment and its retirement
// finds the marker it judged gone, written anew by the other replay's
// re-application, and refuses. The message is applied once more.
func TestKafkaConcurrentReplaysApplyOnce(t *testing.T) {
	t.Parallel()
	const id = "ord-7"
	e := newKafkaReplayEnv(t, id)
	ctx, pool, o, open, effects := e.ctx, e.pool, e.o, e.open, e.effects
	held := newHeldDB(pool, id)
	slow, err := NewInbox(held, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	fast, err := NewInbox(pool, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	sel := Selection{Filter: Filter{IDs: []string{id}}, Apply: true}
	type outcome struct {
		res Result
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		res, err := Replay(ctx, open(), slow, sel, Retirement{By: "alice", Why: "INC-7: ship it once more"})
		first <- outcome{res, err}
	}()
	select {
	case <-held.judged:
	case r := <-first:
		t.Fatalf("the first replay ended before it judged the letter: %+v %v", r.res, r.err)
	case <-ctx.Done():
		t.Fatal("the first replay did not judge the letter in time")
	}
	res, err := Replay(ctx, open(), fast, sel, Retirement{By: "bob", Why: "INC-7: ship it once more"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Items) != 1 || res.Items[0].Retired == nil || !res.Items[0].Sent {
		t.Fatalf("second replay: %+v, want the letter replayed", res)
	}
	waitFor(t, "the consumer to apply the second replay", func() bool { return effects() == 2 })
	close(held.release)
	var r outcome
	select {
	case r = <-first:
	case <-ctx.Done():
		t.Fatal("the first replay did not end in time after its release")
	}
	if r.err != nil && !errors.Is(r.err, ErrNoMarker) {
		t.Fatalf("first replay: %v", r.err)
	}
	sent := 0
	for _, it := range r.res.Items {
		if it.Sent {
			sent++
		}
	}
	// The consumer has settled the order twice (dead letter aside): the
	// first application and the second replay; and whatever the first
	// replay sent.
	waitFor(t, "the consumer to settle what the replays sent", func() bool { return o.count() >= 2+sent })
	if n := effects(); n != 2 {
		t.Errorf("effects of %s: %d, want 2 (applied, then once more by one replay); first replay: %+v", id, n, r.res.Items)
	}
	if r.err == nil && (r.res.Refused != 1 || len(r.res.Items) != 1 || r.res.Items[0].Sent) {
		t.Errorf("first replay: %+v, want the letter refused", r.res)
	}
}

// A replay killed between the produce of the letter and the commit that
// settles it (its client closed there, as a SIGKILL leaves it) leaves the
// letter in the topic and the message sent: the consumer applies it once
// more, and the replay run again refuses the copy left behind, since the
// marker there is its own effect. No double.
func TestKafkaReplayCrashBetweenProduceAndCommit(t *testing.T) {
	t.Parallel()
	const id = "ord-8"
	e := newKafkaReplayEnv(t, id)
	in, err := NewInbox(e.pool, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	sel := Selection{Filter: Filter{IDs: []string{id}}, Apply: true}
	ret := Retirement{By: "alice", Why: "INC-8: ship it once more"}
	k := e.open()
	k.afterProduce = func(*Letter) { k.cl.Close() }
	res, err := Replay(e.ctx, k, in, sel, ret)
	if err == nil || len(res.Items) != 1 || !res.Items[0].Sent || res.Items[0].Done || res.Items[0].Retired == nil {
		t.Fatalf("replay over a client closed after the produce: %v %+v, want sent, not settled", err, res)
	}
	waitFor(t, "the consumer to apply the replay", func() bool { return e.effects() == 2 })
	for _, apply := range []bool{false, true} {
		sel.Apply = apply
		res, err = Replay(e.ctx, e.open(), in, sel, ret)
		if err != nil {
			t.Fatal(err)
		}
		if res.Refused != 1 || len(res.Items) != 1 || res.Items[0].Sent || !strings.Contains(res.Items[0].Why, "already replayed") {
			t.Fatalf("replay run again (apply %v): %+v, want the copy refused as already replayed", apply, res)
		}
	}
	if n := e.effects(); n != 2 {
		t.Errorf("effects of %s: %d, want 2", id, n)
	}
}
