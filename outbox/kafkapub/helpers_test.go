package kafkapub_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
)

// cluster starts an in-process Kafka that creates no topic on its own.
func cluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	return kafkatest.NewCluster(t, opts...)
}

// producer returns a client fit for the publisher, closed at test end.
func producer(t testing.TB, brokers []string, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	opts := append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, kafkapub.ProducerOptions()...)
	cl, err := kgo.NewClient(append(opts, extra...)...)
	if err != nil {
		t.Fatalf("creating client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func publisher(t testing.TB, cl *kgo.Client) *kafkapub.Publisher {
	t.Helper()
	p, err := kafkapub.New(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// topic creates topic with n partitions and the given topic configs.
func topic(t testing.TB, brokers []string, name string, n int32, configs map[string]string) string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cfg := make(map[string]*string, len(configs))
	for k, v := range configs {
		cfg[k] = &v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, n, 1, cfg, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", name, err)
	}
	return name
}

// rec is the outbox record number seq of key, as Enqueue would have made
// it: a UUIDv7 ID whose time is the event time.
func rec(topic, key string, seq int, body string) outbox.Record {
	at := time.Now().Add(-time.Duration(seq) * time.Millisecond).UTC().Truncate(time.Millisecond)
	id := idem.NewUUIDv7(at)
	tm, _ := idem.TimeFromUUIDv7(id)
	return outbox.Record{
		Seq: int64(seq), ID: id, Destination: topic, Key: key,
		Headers: map[string]string{"x-seq": strconv.Itoa(seq)},
		Body:    []byte(body), EventTime: tm,
	}
}

// consume reads topic from the start until it has n records or no new
// record came for a while, and returns what it read.
func consume(t testing.TB, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	idle := 0
	for len(got) < n && idle < 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		before := len(got)
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r) })
		if len(got) == before {
			idle++
		} else {
			idle = 0
		}
	}
	return got
}

func header(r *kgo.Record, k string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value), true
		}
	}
	return "", false
}

func describe(errs []error) string {
	var b strings.Builder
	for i, err := range errs {
		fmt.Fprintf(&b, "\n  %d: %v (refused %v)", i, err, outbox.IsRefused(err))
	}
	return b.String()
}
