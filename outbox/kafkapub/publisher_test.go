package kafkapub_test

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/testrun"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/pgxinbox"
)

// A client that could lose, duplicate or reorder a record is refused, and
// the error names every setting at fault.
func TestNewRefusesUnsafeClient(t *testing.T) {
	t.Parallel()
	seed := kgo.SeedBrokers("127.0.0.1:1")
	cases := []struct {
		name string
		opts []kgo.Opt
		want []string
	}{
		{"automatic flushing", []kgo.Opt{seed}, []string{"kgo.ManualFlushing"}},
		{"leader acks", []kgo.Opt{seed, kgo.ManualFlushing(), kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()},
			[]string{"all in-sync replicas", "idempotent writes are disabled"}},
		{"transactional", []kgo.Opt{seed, kgo.ManualFlushing(), kgo.TransactionalID("relay-1")}, []string{"transactional"}},
	}
	for _, c := range cases {
		cl, err := kgo.NewClient(c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kafkapub.New(cl, nil)
		cl.Close()
		if !errors.Is(err, kafkapub.ErrClientUnsafe) {
			t.Errorf("%s: New returned %v, want ErrClientUnsafe", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", c.name, err, w)
			}
		}
	}
	if _, err := kafkapub.New(nil, nil); !errors.Is(err, kafkapub.ErrClientUnsafe) {
		t.Errorf("New(nil) returned %v", err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{seed}, kafkapub.ProducerOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kafkapub.New(cl, nil); err != nil {
		t.Errorf("a client with ProducerOptions is refused: %v", err)
	}
}

// What the publisher produces is what an idemkafka consumer reads: the
// record's ID as the message ID, the time inside it as the event time
// (from the ID), the caller's headers and the event-time header, the key
// and the body; the record timestamp is the event time.
func TestDeliveredToIdemConsumer(t *testing.T) {
	t.Parallel()
	k := cluster(t)
	brokers := k.ListenAddrs()
	tp := topic(t, brokers, "invoices", 2, nil)
	topic(t, brokers, tp+".dlq", 2, nil)
	pub := publisher(t, producer(t, brokers))

	var recs []outbox.Record
	for i := range 12 {
		r := rec(tp, fmt.Sprintf("customer-%d", i%3), i, fmt.Sprintf(`{"n":%d}`, i))
		r.Headers["content-type"] = "application/json"
		recs = append(recs, r)
	}
	for i, err := range pub.Publish(context.Background(), recs) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}

	url := pgtest.Schema(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]idem.Message{}
	all := make(chan struct{})
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "kafkapub-test", Key: idem.ByMessageID,
		Handler: func(_ context.Context, _ pgx.Tx, m idem.Message) error {
			mu.Lock()
			defer mu.Unlock()
			seen[m.ID] = m
			if len(seen) == len(recs) {
				close(all)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	group := "kafkapub-test"
	opts := append(idemkafka.GroupOptions(group, tp), kgo.SeedBrokers(brokers...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	cl, err := kgo.NewClient(append(opts, kafkatest.GroupOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	cons, err := idemkafka.NewConsumer(cl, proc, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := testrun.Start(t, cons, time.Minute)
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		t.Fatal("the consumer did not apply every published record")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		m, ok := seen[r.ID]
		switch {
		case !ok:
			t.Errorf("record %s was not consumed", r.ID)
		case m.TimeSource != idem.TimeFromID || !m.Time.Equal(r.EventTime):
			t.Errorf("record %s: event time %v from %v, want %v from the ID", r.ID, m.Time, m.TimeSource, r.EventTime)
		case m.Key != r.Key || string(m.Body) != string(r.Body):
			t.Errorf("record %s: key %q body %q, want %q %q", r.ID, m.Key, m.Body, r.Key, r.Body)
		case m.Headers["content-type"] != "application/json" || m.Headers["x-seq"] != r.Headers["x-seq"]:
			t.Errorf("record %s: headers %v lack the caller's", r.ID, m.Headers)
		case m.Headers[idembroker.HeaderEventTime] != r.EventTime.Format(time.RFC3339Nano):
			t.Errorf("record %s: event-time header %q, want %q", r.ID, m.Headers[idembroker.HeaderEventTime], r.EventTime.Format(time.RFC3339Nano))
		}
	}
	for _, got := range consume(t, brokers, tp, len(recs)) {
		id, _ := header(got, idemkafka.DefaultIDHeader)
		tm, _ := idem.TimeFromUUIDv7(id)
		if !got.Timestamp.Equal(tm) {
			t.Errorf("record %s: timestamp %v, want the event time %v", id, got.Timestamp, tm)
		}
	}
}

// A record to a topic that does not exist (and that the broker does not
// create) is refused, its key's later records are not attempted, and the
// other keys' records go through.
func TestUnknownTopicRefused(t *testing.T) {
	t.Parallel()
	k := cluster(t)
	brokers := k.ListenAddrs()
	good := topic(t, brokers, "ledger", 1, nil)
	pub := publisher(t, producer(t, brokers, kgo.UnknownTopicRetries(1)))
	recs := []outbox.Record{
		rec(good, "a", 0, "a0"),
		rec("no-such-topic", "b", 1, "b1"),
		rec(good, "a", 2, "a2"),
		rec(good, "b", 3, "b3"), // after b's failure: not attempted
		rec(good, "c", 4, "c4"),
	}
	errs := pub.Publish(context.Background(), recs)
	if errs[0] != nil || errs[2] != nil || errs[4] != nil {
		t.Fatalf("healthy records failed:%s", describe(errs))
	}
	if !outbox.IsRefused(errs[1]) || !strings.Contains(errs[1].Error(), "does not exist") {
		t.Errorf("record to a missing topic: %v, want refused, naming the missing topic", errs[1])
	}
	if !errors.Is(errs[3], outbox.ErrNotAttempted) {
		t.Errorf("later record of the refused key: %v, want ErrNotAttempted", errs[3])
	}
	got := consume(t, brokers, good, 3)
	if len(got) != 3 {
		t.Fatalf("the topic has %d records, want 3", len(got))
	}
	for i, want := range []string{"a0", "a2", "c4"} {
		if string(got[i].Value) != want {
			t.Errorf("record %d is %q, want %q", i, got[i].Value, want)
		}
	}
}

// A record larger than the client's batch limit is refused before anything
// is produced; one within it but larger than the topic's max.message.bytes
// makes the broker refuse its batch, and the batch's records are produced
// again one by one so that only the large record is refused. Either way the
// large record's key stops there and every other record goes through in
// order.
func TestTooLargeRefused(t *testing.T) {
	t.Parallel()
	k := cluster(t)
	brokers := k.ListenAddrs()
	tp := topic(t, brokers, "small", 1, map[string]string{"max.message.bytes": "4096"})
	// Random bytes: the producer compresses, and a compressible body
	// would fit.
	raw := make([]byte, 8000)
	_, _ = crand.Read(raw)
	big := string(raw)

	t.Run("client limit", func(t *testing.T) {
		pub := publisher(t, producer(t, brokers, kgo.ProducerBatchMaxBytes(6000)))
		recs := []outbox.Record{rec(tp, "a", 0, "a0"), rec(tp, "b", 1, big), rec(tp, "b", 2, "b2"), rec(tp, "a", 3, "a3")}
		errs := pub.Publish(context.Background(), recs)
		if errs[0] != nil || errs[3] != nil {
			t.Fatalf("healthy records failed:%s", describe(errs))
		}
		if !outbox.IsRefused(errs[1]) || !strings.Contains(errs[1].Error(), "batch limit") {
			t.Errorf("large record: %v, want refused for the batch limit", errs[1])
		}
		if !errors.Is(errs[2], outbox.ErrNotAttempted) {
			t.Errorf("later record of the large one's key: %v, want ErrNotAttempted", errs[2])
		}
	})
	t.Run("topic limit", func(t *testing.T) {
		pub := publisher(t, producer(t, brokers))
		recs := []outbox.Record{
			rec(tp, "c", 10, "c10"), rec(tp, "d", 11, big), rec(tp, "c", 12, "c12"),
			rec(tp, "d", 13, "d13"), rec(tp, "e", 14, "e14"),
		}
		errs := pub.Publish(context.Background(), recs)
		if errs[0] != nil || errs[2] != nil || errs[4] != nil {
			t.Fatalf("records beside the large one failed:%s", describe(errs))
		}
		if !outbox.IsRefused(errs[1]) {
			t.Errorf("large record: %v, want refused", errs[1])
		}
		if !errors.Is(errs[3], outbox.ErrNotAttempted) {
			t.Errorf("later record of the large one's key: %v, want ErrNotAttempted", errs[3])
		}
	})
	var values []string
	for _, r := range consume(t, brokers, tp, 5) {
		values = append(values, string(r.Value))
	}
	for i, v := range values {
		if len(v) > 20 {
			values[i] = "(large)"
		}
	}
	if got, want := strings.Join(values, ","), "a0,a3,c10,c12,e14"; got != want {
		t.Errorf("the topic holds %s, want %s", got, want)
	}
}

// A broker that went away is an outage: every record fails, none is
// refused, and nothing is reported published.
func TestBrokerDownIsOutage(t *testing.T) {
	t.Parallel()
	k := cluster(t)
	brokers := k.ListenAddrs()
	tp := topic(t, brokers, "down", 2, nil)
	pub := publisher(t, producer(t, brokers, kgo.RetryTimeout(time.Second)))
	if err := pub.Publish(context.Background(), []outbox.Record{rec(tp, "a", 0, "warm-up")})[0]; err != nil {
		t.Fatal(err)
	}
	k.Close()
	var recs []outbox.Record
	for i := range 6 {
		recs = append(recs, rec(tp, fmt.Sprint(i%2), i+1, "lost?"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for i, err := range pub.Publish(ctx, recs) {
		if err == nil || outbox.IsRefused(err) {
			t.Errorf("record %d with the broker gone: %v, want an outage error", i, err)
		}
	}
}

// Records of one key arrive in the order they were handed over, over many
// calls and partitions: 1,000 records on 10 keys, 100 a call.
func TestPerKeyOrder(t *testing.T) {
	t.Parallel()
	k := cluster(t)
	brokers := k.ListenAddrs()
	tp := topic(t, brokers, "ordered", 4, nil)
	pub := publisher(t, producer(t, brokers))
	const n, keys, call = 1000, 10, 100
	for from := 0; from < n; from += call {
		var recs []outbox.Record
		for i := from; i < from+call; i++ {
			recs = append(recs, rec(tp, fmt.Sprintf("key-%d", i%keys), i, fmt.Sprint(i)))
		}
		for i, err := range pub.Publish(context.Background(), recs) {
			if err != nil {
				t.Fatalf("record %d: %v", from+i, err)
			}
		}
	}
	got := consume(t, brokers, tp, n)
	if len(got) != n {
		t.Fatalf("the topic has %d records, want %d", len(got), n)
	}
	last := map[string]int{}
	partition := map[string]int32{}
	for _, r := range got {
		var seq int
		if _, err := fmt.Sscan(string(r.Value), &seq); err != nil {
			t.Fatal(err)
		}
		key := string(r.Key)
		if p, ok := partition[key]; ok && p != r.Partition {
			t.Errorf("key %s is on partitions %d and %d", key, p, r.Partition)
		}
		partition[key] = r.Partition
		if prev, ok := last[key]; ok && seq <= prev {
			t.Errorf("key %s: record %d after %d", key, seq, prev)
		}
		last[key] = seq
	}
	if len(last) != keys {
		t.Errorf("%d keys arrived, want %d", len(last), keys)
	}
}
