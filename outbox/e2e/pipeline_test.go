package e2e_test

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/pgxinbox"
)

// messagesEnv raises the number of input messages of the pipeline test
// (2,000 by default, so that the test stays within a minute).
const messagesEnv = "IDEM_E2E_MESSAGES"

// The whole pipeline, with every part killed with SIGKILL and started again
// while messages flow: consumer A applies an effect and enqueues a
// follow-up event in the same transaction (and rolls both back for one
// message in ten), the relay publishes the events to RabbitMQ, consumer B
// applies them. At the end every A effect happened once, every B effect
// once, each for an A effect that committed, and no event of a rolled-back
// effect was published.
func TestPipelineKilled(t *testing.T) {
	p := newPipeline(t)
	killedPipeline(t, p, p.env(), "relay", "a", "b")
}

// The same with the events on Kafka: the relay publishes them with
// kafkapub to an in-process Kafka, consumer B is an idemkafka consumer in
// a group. Every part is killed, B too: each B killed leaves a member that
// the group waits for, and B's group timeouts (package kafkatest: a
// session longer than the rebalance timeout) keep the next B from being
// dropped while it waits in its join, which stalled B for minutes when
// its session was shorter than the wait.
func TestPipelineKilledKafka(t *testing.T) {
	p := newPipeline(t)
	k := kafkatest.NewCluster(t)
	topic := "events"
	kafkatest.CreateTopics(t, k.ListenAddrs(), 4, topic, topic+".dlq")
	t.Cleanup(func() {
		if t.Failed() {
			kafkaState(t, k.ListenAddrs(), topic)
		}
	})
	killedPipeline(t, p, p.env(kafkaEnv+"="+strings.Join(k.ListenAddrs(), ","), topicEnv+"="+topic), "relay", "a", "b")
}

// kafkaState logs what the topic holds and where consumer B's group is.
func kafkaState(t *testing.T, brokers []string, topic string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Log(err)
		return
	}
	defer cl.Close()
	ids := map[string]bool{}
	total := 0
	for idle := 0; idle < 3; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			for _, h := range r.Headers {
				if h.Key == idembroker.HeaderMessageID {
					ids[string(h.Value)] = true
				}
			}
		})
		total += n
		if n == 0 {
			idle++
		}
	}
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	committed, err2 := adm.FetchOffsets(ctx, "consumer-b")
	groups, err3 := adm.DescribeGroups(ctx, "consumer-b")
	t.Logf("topic %s: %d records, %d distinct IDs; end offsets %v (%v); group committed %v (%v); group %+v (%v)",
		topic, total, len(ids), ends, err, committed, err2, groups, err3)
}

// killedPipeline runs the relay and both consumers, kills the parts named
// by kill at random while n messages go in, and checks every effect
// happened once.
func killedPipeline(t *testing.T, p *pipeline, env []string, kill ...string) {
	n := 2000
	if s := os.Getenv(messagesEnv); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n <= 0 {
			t.Fatalf("%s=%q is not a positive count", messagesEnv, s)
		}
	}
	parts := []*process{spawn(t, "relay", env), spawn(t, "a", env), spawn(t, "b", env)}
	var victims []*process
	for _, part := range parts {
		if slices.Contains(kill, part.role) {
			victims = append(victims, part)
		}
	}

	// Kill one part at random every few hundred milliseconds until the
	// input is in and a few kills of each part happened.
	var (
		mu    sync.Mutex
		kills = map[string]int{}
		stop  = make(chan struct{})
		ended = make(chan struct{})
	)
	go func() {
		defer close(ended)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(300+rand.IntN(500)) * time.Millisecond):
			}
			part := victims[rand.IntN(len(victims))]
			part.restart()
			mu.Lock()
			kills[part.role]++
			mu.Unlock()
		}
	}()
	for from := 0; from < n; from += 500 {
		p.publishInput(t, from, min(from+500, n))
		time.Sleep(200 * time.Millisecond) // let the kills fall while messages flow
	}
	waitFor(t, 2*time.Minute, "three kills of every part", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, role := range kill {
			if kills[role] < 3 {
				return false
			}
		}
		return true
	})
	close(stop)
	<-ended

	want := int64(0)
	for i := range n {
		if !rejected(i) {
			want++
		}
	}
	var last counts
	defer func() {
		if t.Failed() {
			t.Logf("want %d effects of A and of B; last counts %+v, kills %v", want, last, kills)
		}
	}()
	waitFor(t, 3*time.Minute, "every effect", func() bool {
		last = p.counts(t)
		return last.aDistinct == want && last.bDistinct == want && last.unsent == 0
	})
	c := p.counts(t)
	t.Logf("%d input messages, kills %v, exits of their own (restarted) %d, counts %+v", n, kills, parts[0].ownExits()+parts[1].ownExits()+parts[2].ownExits(), c)
	if c.aRows != want || c.bRows != want {
		t.Errorf("A has %d effect rows, B %d; want %d each, once per message", c.aRows, c.bRows, want)
	}
	if c.parked != 0 {
		t.Errorf("%d outbox rows parked", c.parked)
	}
	ctx := context.Background()
	var bad int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM a_effects WHERE n % 10 = 3`).Scan(&bad); err != nil || bad != 0 {
		t.Errorf("%d effects of rolled-back transactions in A (%v)", bad, err)
	}
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM b_effects WHERE n % 10 = 3`).Scan(&bad); err != nil || bad != 0 {
		t.Errorf("%d events of rolled-back effects applied by B (%v)", bad, err)
	}
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE convert_from(body, 'UTF8')::int % 10 = 3`).Scan(&bad); err != nil || bad != 0 {
		t.Errorf("%d outbox rows of rolled-back effects (%v)", bad, err)
	}
	// Each B effect is the event of an A effect: same number, caused by it.
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM b_effects b LEFT JOIN a_effects a ON a.message_id = b.cause AND a.n = b.n WHERE a.message_id IS NULL`).Scan(&bad); err != nil || bad != 0 {
		t.Errorf("%d B effects without their A effect (%v)", bad, err)
	}
}

// A relay that dies after the broker confirmed a batch and before it
// marked the rows sent: the next relay publishes the same IDs again, and
// consumer B's inbox skips every copy. A rolled-back transaction's
// messages are never published.
func TestCrashBetweenPublishAndMark(t *testing.T) {
	p := newPipeline(t)
	ctx := context.Background()
	const n = 300
	for i := 0; i < n; i += 50 {
		tx, err := p.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []outbox.Message
		for j := i; j < i+50; j++ {
			msgs = append(msgs, outbox.Message{DefaultExchange: true, RoutingKey: p.queueB, Key: "k" + strconv.Itoa(j%7),
				Body: []byte(strconv.Itoa(j)), Headers: map[string]string{"x-cause": "direct"}})
		}
		if _, err := p.ob.Enqueue(ctx, tx, msgs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rolledBack, err := p.ob.Enqueue(ctx, tx, outbox.Message{DefaultExchange: true, RoutingKey: p.queueB, Key: "k1", Body: []byte("-1")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Consumer B runs in the test, so that its duplicates can be counted.
	obs := &outcomes{n: map[idem.Outcome]int{}}
	store, err := pgxinbox.New(p.pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{Consumer: "consumer-b", Key: idem.ByMessageID, Hooks: []idem.Hook{obs}, Logger: quiet,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			v, err := strconv.Atoi(string(m.Body))
			if err != nil {
				return idem.Permanent(err)
			}
			_, err = tx.Exec(ctx, `INSERT INTO b_effects (message_id, n, cause) VALUES ($1, $2, $3)`, m.ID, v, m.Headers["x-cause"])
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: amqpURL(), Queue: p.queueB, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- cons.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-consumed })

	died := filepath.Join(t.TempDir(), "died")
	relay := spawnOnce(t, "relay", p.env(dieAfterEnv+"=2", diedFileEnv+"="+died, leaseTermEnv+"=1500ms"))
	select {
	case <-relay.exited():
	case <-time.After(2 * time.Minute):
		t.Fatal("the relay did not die after its second batch")
	}
	raw, err := os.ReadFile(died)
	if err != nil {
		t.Fatalf("the relay died without naming its batch: %v", err)
	}
	ids := strings.Split(string(raw), "\n")
	var unmarked int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE id = ANY($1) AND sent_at IS NULL`, ids).Scan(&unmarked); err != nil {
		t.Fatal(err)
	}
	if unmarked != len(ids) {
		t.Fatalf("%d of the %d rows published before the crash are unmarked, want all", unmarked, len(ids))
	}

	spawn(t, "relay", p.env(leaseTermEnv+"=1500ms"))
	waitFor(t, 2*time.Minute, "every event applied by B", func() bool {
		c := p.counts(t)
		return c.bDistinct == n && c.unsent == 0
	})
	c := p.counts(t)
	if c.bRows != n {
		t.Errorf("B has %d effect rows, want %d, once per event", c.bRows, n)
	}
	waitFor(t, time.Minute, "the republished copies", func() bool { return obs.get(idem.Duplicate) >= len(ids) })
	var bad int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM b_effects WHERE message_id = ANY($1)`, rolledBack).Scan(&bad); err != nil || bad != 0 {
		t.Errorf("the rolled-back transaction's message was applied %d times (%v)", bad, err)
	}
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE id = ANY($1)`, rolledBack).Scan(&bad); err != nil || bad != 0 {
		t.Errorf("the rolled-back transaction left %d outbox rows (%v)", bad, err)
	}
	t.Logf("%d rows republished after the crash; B saw %d duplicates", len(ids), obs.get(idem.Duplicate))
}

// outcomes counts the processor's results.
type outcomes struct {
	mu sync.Mutex
	n  map[idem.Outcome]int
}

func (o *outcomes) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[r.Outcome]++
}

func (o *outcomes) get(out idem.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}
