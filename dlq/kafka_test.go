package dlq

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"

	"github.com/idemkit/idem/internal/kafkatest"
)

type outcomes struct {
	mu sync.Mutex
	m  map[string][]idem.Outcome
	n  int
}

func (o *outcomes) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string][]idem.Outcome{}
	}
	o.m[r.MessageID] = append(o.m[r.MessageID], r.Outcome)
	o.n++
}

func (o *outcomes) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// The Kafka round: a consumer whose handler fails permanently fills the
// dead-letter topic; list groups the letters, show judges one, a dry run
// changes nothing, a redrive of a letter behind a kept one sends it but
// cannot settle it (the topic settles a prefix), a full redrive settles
// all, and the fixed consumer applies each message exactly once.
// TestKafkaListShowRedrive runs list, show, redrive and replay of Kafka
// dead letters on a pool of pgx's default size and on a pool of one
// connection.
func TestKafkaListShowRedrive(t *testing.T) {
	t.Parallel()
	for _, conns := range []int{0, 1} {
		t.Run(fmt.Sprintf("conns=%d", conns), func(t *testing.T) {
			t.Parallel()
			kafkaListShowRedrive(t, conns)
		})
	}
}

func kafkaListShowRedrive(t *testing.T, conns int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := kafkatest.NewCluster(t)
	brokers := c.ListenAddrs()
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	topic := "orders-" + hex.EncodeToString(b)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tn := range []string{topic, topic + ".dlq"} {
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, tn); err != nil {
			t.Fatal(err)
		}
	}
	ids := []string{"ord-1", "ord-2", "ord-3"}
	for _, id := range ids {
		if err := cl.ProduceSync(ctx, idemkafka.NewRecord(topic, id, []byte(id), []byte(`{"order":"`+id+`"}`))).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	pool := pgtest.PoolOf(t, conns)
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
	// consume runs a consumer until until() holds.
	consume := func(broken bool, until func(*outcomes) bool) *outcomes {
		t.Helper()
		o := &outcomes{}
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
		rctx, stop := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- cons.Run(rctx) }()
		for !until(o) {
			select {
			case err := <-errc:
				stop()
				t.Fatalf("consumer stopped: %v", err)
			case <-ctx.Done():
				stop()
				t.Fatalf("consumer: %d outcomes when the test timed out", o.count())
			case <-time.After(20 * time.Millisecond):
			}
		}
		stop()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("consumer: %v", err)
		}
		return o
	}

	src, err := NewKafka(ctx, KafkaConfig{Brokers: brokers, Topic: topic + ".dlq"})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	peekN := func() int {
		ls, err := src.Peek(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(ls)
	}
	consume(true, func(*outcomes) bool { return peekN() == 3 })

	ls, err := List(ctx, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Total != 3 || len(ls.Groups) != 1 || ls.Groups[0].Consumer != "orders-ship" || !strings.Contains(ls.Groups[0].Reason, "carrier unknown for order <id>") {
		t.Fatalf("listing %+v", ls)
	}
	sh, err := Show(ctx, src, nil, "ord-2")
	if err != nil {
		t.Fatal(err)
	}
	if sh.Judgement.Verdict != Unknown || sh.Letter.Target != topic || sh.Letter.Position != "0/1" || string(sh.Letter.Body) != `{"order":"ord-2"}` {
		t.Fatalf("show without inbox %+v", sh)
	}
	in, err := NewInbox(pool, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	if sh, err = Show(ctx, src, in, "ord-2"); err != nil || sh.Judgement.Verdict != Apply {
		t.Fatalf("show %+v %v", sh.Judgement, err)
	}

	res, err := Redrive(ctx, src, in, Selection{})
	if err != nil || res.Matched != 3 || res.Done != 0 || peekN() != 3 {
		t.Fatalf("dry run %+v %v", res, err)
	}
	// ord-2 is behind ord-1, which stays: sent, not settled.
	res, err = Redrive(ctx, src, in, Selection{Filter: Filter{IDs: []string{"ord-2"}}, Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 1 || res.Done != 0 || !res.Items[0].Sent || res.Items[0].Done {
		t.Fatalf("redrive behind a kept letter %+v", res)
	}
	if n := peekN(); n != 3 {
		t.Fatalf("%d letters left, want 3", n)
	}
	res, err = Redrive(ctx, src, in, Selection{Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 3 {
		t.Fatalf("redrive %+v", res)
	}
	if n := peekN(); n != 0 {
		t.Fatalf("%d letters left after the redrive", n)
	}
	// 4 records back in the topic (ord-2 twice); each applied once.
	o := consume(false, func(o *outcomes) bool { return o.count() >= 4 })
	for _, id := range ids {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("%s applied %d times (outcomes %v)", id, n, o.m[id])
		}
	}
	if got := o.m["ord-2"]; len(got) != 2 || got[1] != idem.Duplicate {
		t.Fatalf("ord-2 outcomes %v, want applied then duplicate", got)
	}
	// The redriven records carry the ID and the redrive count, not the
	// dead-letter headers.
	rec := lastRecord(ctx, t, brokers, topic)
	h := map[string]string{}
	for _, x := range rec.Headers {
		h[x.Key] = string(x.Value)
	}
	if h[idemkafka.DefaultIDHeader] == "" || h[idembroker.HeaderRedriven] != "1" || h[idembroker.HeaderReason] != "" || h[idembroker.HeaderOrigin] != "" {
		t.Fatalf("redriven record headers %v", h)
	}
}

func lastRecord(ctx context.Context, t *testing.T, brokers []string, topic string) *kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var last *kgo.Record
	for last == nil || last.Offset < 5 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v", topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) { last = r })
	}
	return last
}

// The client dies after the redrive was acknowledged by all replicas and
// before the dead-letter group's offset was committed: the letter stays in
// the topic, the redrive is in the origin topic; the next redrive sends it
// again (the inbox absorbs it, see TestKafkaListShowRedrive) and settles it.
func TestKafkaCrashBetweenProduceAndCommit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := kafkatest.NewCluster(t)
	brokers := c.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for _, tn := range []string{"pay", "pay.dlq"} {
		if _, err := adm.CreateTopic(ctx, 1, 1, nil, tn); err != nil {
			t.Fatal(err)
		}
	}
	r := idemkafka.NewRecord("pay.dlq", "pay-1", []byte("pay-1"), []byte(`{}`))
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: idembroker.HeaderReason, Value: []byte("boom")}, kgo.RecordHeader{Key: idembroker.HeaderOrigin, Value: []byte("pay/0/0")})
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
	open := func() *Kafka {
		k, err := NewKafka(ctx, KafkaConfig{Brokers: brokers, Topic: "pay.dlq"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k.Close() })
		return k
	}
	ends := func() (origin, left int) {
		end, err := adm.ListEndOffsets(ctx, "pay")
		if err != nil {
			t.Fatal(err)
		}
		o, _ := end.Lookup("pay", 0)
		ls, err := open().Peek(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		return int(o.Offset), len(ls)
	}
	k := open()
	k.afterProduce = func(*Letter) { k.cl.Close() }
	res, err := Redrive(ctx, k, nil, Selection{Apply: true})
	if err == nil || res.Done != 0 || len(res.Items) != 1 || !res.Items[0].Sent {
		t.Fatalf("redrive over a dead client: %v %+v", err, res)
	}
	if o, l := ends(); o != 1 || l != 1 {
		t.Fatalf("after the crash: origin %d records, %d letters; want 1, 1", o, l)
	}
	res, err = Redrive(ctx, open(), nil, Selection{Apply: true})
	if err != nil || res.Done != 1 {
		t.Fatalf("second redrive: %v %+v", err, res)
	}
	if o, l := ends(); o != 2 || l != 0 {
		t.Fatalf("after the second redrive: origin %d records, %d letters; want 2, 0", o, l)
	}
}

// Letters the topic's retention deleted before anyone settled them are
// gone: a listing says how many.
func TestKafkaListWarnsOfDeletedLetters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := kafkatest.NewCluster(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, "tax.dlq"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"t-1", "t-2", "t-3"} {
		r := idemkafka.NewRecord("tax.dlq", id, nil, []byte(`{}`))
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: idembroker.HeaderReason, Value: []byte("boom")}, kgo.RecordHeader{Key: idembroker.HeaderOrigin, Value: []byte("tax/0/0")})
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	k, err := NewKafka(ctx, KafkaConfig{Brokers: c.ListenAddrs(), Topic: "tax.dlq"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	ls, err := List(ctx, k, 0)
	if err != nil || ls.Total != 3 || len(ls.Warnings) != 0 {
		t.Fatalf("list %+v %v", ls, err)
	}
	var o kadm.Offsets
	o.Add(kadm.Offset{Topic: "tax.dlq", Partition: 0, At: 2, LeaderEpoch: -1})
	resp, err := adm.DeleteRecords(ctx, o)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	ls, err = List(ctx, k, 0)
	if err != nil || ls.Total != 1 || len(ls.Warnings) != 1 || !strings.Contains(ls.Warnings[0], "2 letters of tax.dlq were deleted") {
		t.Fatalf("list after retention %+v %v", ls, err)
	}
}

// An interrupted redrive (SIGINT cancels the command's context) still
// settles the letters produced and acked before the interruption: the
// commit that ends the walk does not use the cancelled context.
func TestKafkaInterruptedRedriveSettles(t *testing.T) {
	t.Parallel()
	ctx, cancelAll := context.WithTimeout(context.Background(), time.Minute)
	defer cancelAll()
	c := kafkatest.NewCluster(t)
	brokers := c.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tn := range []string{"pay", "pay.dlq"} {
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, tn); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"pay-1", "pay-2", "pay-3"} {
		r := idemkafka.NewRecord("pay.dlq", id, []byte(id), []byte(`{}`))
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: idembroker.HeaderReason, Value: []byte("boom")}, kgo.RecordHeader{Key: idembroker.HeaderOrigin, Value: []byte("pay/0/0")})
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	k, err := NewKafka(ctx, KafkaConfig{Brokers: brokers, Topic: "pay.dlq"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	rctx, interrupt := context.WithCancel(ctx)
	sent, progressed, early := 0, 0, 0
	k.afterProduce = func(*Letter) {
		if sent++; sent == 2 {
			early = progressed // the progress of a long walk is told as it goes
			interrupt()        // after the second letter was acked
		}
	}
	res, err := Redrive(rctx, k, nil, Selection{Apply: true, Progress: func(done, _ int) { progressed = done }})
	if early != 2 {
		t.Errorf("progress before the walk ended: %d letters, want 2", early)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted redrive: %v, want context.Canceled", err)
	}
	if res.Done != 2 || len(res.Items) != 2 || !res.Items[0].Done || !res.Items[1].Done {
		t.Fatalf("interrupted redrive: done %d, items %+v; want the 2 acked settled", res.Done, res.Items)
	}
	ls, err := k.Peek(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].ID != "pay-3" {
		t.Errorf("after the interrupt %d letters are unsettled (%v); want pay-3 alone", len(ls), ls)
	}
}

// Reading a dead-letter topic moves no group's committed offset and
// creates no group: listings, shows, dry runs and a redrive that refuses
// every letter leave the dead-letter group (never committed here) and a
// group that consumes the topic as they were.
func TestKafkaReadingMovesNoOffset(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := kafkatest.NewCluster(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, "tax.dlq"); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"t-1", "t-2", "t-3", "t-4"} {
		// No origin: a redrive refuses them.
		r := idemkafka.NewRecord("tax.dlq", id, nil, []byte(`{}`))
		r.Partition = int32(i % 2)
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: idembroker.HeaderReason, Value: []byte("boom")})
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var o kadm.Offsets
	o.Add(kadm.Offset{Topic: "tax.dlq", Partition: 0, At: 1, LeaderEpoch: -1})
	if resp, err := adm.CommitOffsets(ctx, "watcher", o); err != nil || resp.Error() != nil {
		t.Fatalf("committing the watcher's offsets: %v %v", err, resp.Error())
	}
	before, err := adm.FetchOffsets(ctx, "watcher")
	if err != nil {
		t.Fatal(err)
	}
	k, err := NewKafka(ctx, KafkaConfig{Brokers: c.ListenAddrs(), Topic: "tax.dlq"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for round := range 10 {
		ls, err := List(ctx, k, 0)
		if err != nil || ls.Total != 4 {
			t.Fatalf("round %d: list %+v %v", round, ls, err)
		}
		if sh, err := Show(ctx, k, nil, "t-3"); err != nil || sh.Letter.ID != "t-3" {
			t.Fatalf("round %d: show %+v %v", round, sh, err)
		}
		if res, err := Redrive(ctx, k, nil, Selection{}); err != nil || res.Matched != 4 {
			t.Fatalf("round %d: dry run %+v %v", round, res, err)
		}
		if res, err := Redrive(ctx, k, nil, Selection{Apply: true}); err != nil || res.Refused != 4 || res.Done != 0 {
			t.Fatalf("round %d: refused redrive %+v %v", round, res, err)
		}
	}
	after, err := adm.FetchOffsets(ctx, "watcher")
	if err != nil {
		t.Fatal(err)
	}
	if b, a := before.Offsets().Sorted(), after.Offsets().Sorted(); fmt.Sprint(b) != fmt.Sprint(a) {
		t.Fatalf("the watcher's offsets moved: %v, then %v", b, a)
	}
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if gs := groups.Groups(); len(gs) != 1 || gs[0] != "watcher" {
		t.Fatalf("groups after the reads: %v, want the watcher's only (no dead-letter group committed, none joined)", gs)
	}
}
