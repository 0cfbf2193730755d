package idemkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/adaptertest"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/netfault"
)

// The adapter conformance suite against kfake (or the cluster named by
// IDEM_KAFKA_BROKERS): every check every broker adapter passes.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, newConformanceHarness(t))
}

// conformanceHarness gives the suite one-partition topics, each with its
// dead-letter topic, and consumers built with NewConsumer over a group
// client whose connections go through netfault proxies.
type conformanceHarness struct {
	brokers []string
	admin   *kgo.Client // topics and publishing

	mu      sync.Mutex
	readers map[string]*conformanceReader // topic → its dead-letter reader
}

func newConformanceHarness(t *testing.T) *conformanceHarness {
	h := &conformanceHarness{readers: map[string]*conformanceReader{}}
	if s := os.Getenv("IDEM_KAFKA_BROKERS"); s != "" {
		h.brokers = strings.Split(s, ",")
	} else {
		h.brokers = kafkatest.NewCluster(t).ListenAddrs()
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	h.admin = admin
	return h
}

func (h *conformanceHarness) Features() adaptertest.Features {
	return adaptertest.Features{
		// Every topic has one partition.
		Ordered:                    true,
		ErrNoDeadLetterDestination: idemkafka.ErrDeadLetterTopic,
		StopWithin:                 5 * time.Second,
	}
}

var conformanceUnsafe = regexp.MustCompile(`[^a-z0-9]+`)

func (h *conformanceHarness) Topic(t testing.TB) string {
	t.Helper()
	n := strings.Trim(conformanceUnsafe.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(n) > 60 {
		n = n[len(n)-60:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	topic := n + "-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(h.admin)
	for _, name := range []string{topic, topic + ".dlq"} {
		resp, err := adm.CreateTopic(ctx, 1, 1, nil, name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating topic %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopics(ctx, topic, topic+".dlq"); err != nil {
			t.Logf("deleting %s: %v", topic, err)
		}
	})
	return topic
}

func (h *conformanceHarness) Publish(t testing.TB, topic string, msgs ...adaptertest.Message) {
	t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &kgo.Record{Topic: topic, Value: m.Body, Timestamp: m.Timestamp}
		if m.ID != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: idemkafka.DefaultIDHeader, Value: []byte(m.ID)})
		}
		if !m.EventTime.IsZero() {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: idemkafka.DefaultTimeHeader, Value: []byte(m.EventTime.UTC().Format(time.RFC3339Nano))})
		}
		recs[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.admin.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing to %s: %v", topic, err)
	}
}

// conformanceConsumer is a Consumer whose broker connections go through
// netfault proxies, one per broker, so that the suite can cut them.
type conformanceConsumer struct {
	*idemkafka.Consumer[pgx.Tx]
	proxies map[string]*netfault.Proxy // broker host:port → its proxy
}

func (c conformanceConsumer) Cut() bool {
	for _, p := range c.proxies {
		p.Cut()
	}
	return len(c.proxies) > 0
}

func (c conformanceConsumer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	if p, ok := c.proxies[host]; ok {
		host = p.Addr()
	}
	var d net.Dialer
	return d.DialContext(ctx, network, host)
}

func (h *conformanceHarness) Consumer(t testing.TB, topic string, proc *idem.Processor[pgx.Tx], opts adaptertest.ConsumerOptions) adaptertest.Consumer {
	t.Helper()
	c := conformanceConsumer{proxies: map[string]*netfault.Proxy{}}
	for _, b := range h.brokers {
		c.proxies[b] = netfault.New(t, b)
	}
	// A real cluster refuses sessions under 6s by default.
	timeouts := kafkatest.GroupOptions()
	if os.Getenv("IDEM_KAFKA_BROKERS") != "" {
		timeouts = kafkatest.RealGroupOptions()
	}
	// Consumers of one topic are one group: a later one takes up what an
	// earlier one left.
	cl, err := kgo.NewClient(append(append(idemkafka.GroupOptions(topic+".group", topic),
		kgo.SeedBrokers(h.brokers...),
		kgo.Dialer(c.dial),
	), timeouts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close) // before the proxies close
	cfg := &idemkafka.Config{
		MaxBatch: opts.BatchSize,
		Backoff:  idem.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:   opts.Logger,
	}
	if opts.NoDeadLetterDestination {
		cfg.DeadLetterTopic = func(topic string) string { return topic + ".no-such-dlq" }
	}
	if opts.CrashBeforeAck {
		var once sync.Once
		cfg.Faults = func(context.Context, idem.FaultPoint, string, int32, int64) (err error) {
			once.Do(func() { err = errors.New("process died between commit and offset commit") })
			return err
		}
	}
	c.Consumer, err = idemkafka.NewConsumer(cl, proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// conformanceReader reads a dead-letter topic from its start, keeping what
// it read.
type conformanceReader struct {
	mu   sync.Mutex
	cl   *kgo.Client
	read []adaptertest.DeadLetter
}

func (h *conformanceHarness) DeadLetters(t testing.TB, topic string) []adaptertest.DeadLetter {
	t.Helper()
	h.mu.Lock()
	r, ok := h.readers[topic]
	if !ok {
		cl, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.ConsumeTopics(topic+".dlq"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
		if err != nil {
			h.mu.Unlock()
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		r = &conformanceReader{cl: cl}
		h.readers[topic] = r
	}
	h.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	r.cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
		dl := adaptertest.DeadLetter{Body: rec.Value, Headers: map[string]string{}}
		for _, hd := range rec.Headers {
			dl.Headers[hd.Key] = string(hd.Value)
		}
		dl.ID = dl.Headers[idemkafka.DefaultIDHeader]
		r.read = append(r.read, dl)
	})
	return append([]adaptertest.DeadLetter(nil), r.read...)
}

func (h *conformanceHarness) DropDeadLetters(t testing.TB, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(h.admin).DeleteTopics(ctx, topic+".dlq")
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("deleting %s.dlq: %v", topic, err)
	}
}

func (h *conformanceHarness) RestoreDeadLetters(t testing.TB, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(h.admin).CreateTopic(ctx, 1, 1, nil, topic+".dlq")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating %s.dlq again: %v", topic, err)
	}
}
