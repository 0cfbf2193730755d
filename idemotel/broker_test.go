package idemotel_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/idemrabbitmq"
)

const amqpFixHint = "start it with: rabbitmq-server -detached && rabbitmqctl await_startup (or run make test), or set IDEM_AMQP_URL"

func amqpURL() string {
	if u := os.Getenv("IDEM_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

// uniqueName is a queue, topic or group name for t that no concurrent test
// uses.
func uniqueName(t testing.TB) string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	n := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return "idemotel-" + n + "-" + hex.EncodeToString(b[:])
}

// queue declares a fresh quorum queue with its dead-letter queue, deleted
// when t ends, on a connection of the test's own.
func queue(t testing.TB) (*amqp.Connection, idemrabbitmq.Topology) {
	t.Helper()
	conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable (%v); %s", err, amqpFixHint)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, uniqueName(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			t.Logf("deleting %s: %v", topo.Queue, err)
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			t.Logf("deleting %s: %v", topo.Queue, err)
			return
		}
		if err := idemrabbitmq.DeleteTopology(ch, topo); err != nil {
			t.Logf("deleting %s: %v", topo.Queue, err)
		}
	})
	return conn, topo
}

// run runs a consumer until t ends.
func run(t testing.TB, runFn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runFn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("consumer: %v", err)
		}
	})
}

// TestRabbitMQConsumerUnderProducerTrace: a producer publishes inside its
// span with the trace context in the AMQP headers; the idem consumer's span
// of the message is in the producer's trace, under its span. The consumer
// then crashes between commit and ack: the broker redelivers, and the
// redelivery's span, in the same trace, says duplicate.
func TestRabbitMQConsumerUnderProducerTrace(t *testing.T) {
	t.Parallel()
	tr, d := newTraces(t), newDB(t)
	conn, topo := queue(t)
	app := tr.tp.Tracer("billing")
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		ctx, span := app.Start(ctx, "INSERT invoices")
		defer span.End()
		return invoice(ctx, tx, m)
	}
	p := d.processor(t, "billing-invoice", h, []idem.Hook{tr.tracer(idemotel.RabbitMQ)})
	var crashed atomic.Bool
	c, err := idemrabbitmq.NewConsumer(p, &idemrabbitmq.Config{
		URL: amqpURL(), Queue: topo.Queue, ConnectionName: uniqueName(t),
		ReconnectBackoff: idem.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:           quiet,
		Faults: func(_ context.Context, point idem.FaultPoint, _ []idem.Message) error {
			if point == idemrabbitmq.BeforeSettle && crashed.CompareAndSwap(false, true) {
				return errors.New("crash between commit and ack")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c.Run)

	pub, err := idemrabbitmq.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx, span := tr.tp.Tracer("orders").Start(t.Context(), "send "+topo.Queue, trace.WithSpanKind(trace.SpanKindProducer))
	producer := span.SpanContext()
	err = pub.Publish(ctx, "", topo.Queue, amqp.Publishing{
		MessageId: "inv-1",
		Headers:   idemotel.InjectAMQP(ctx, amqp.Table{"x-tenant": "acme"}),
		Body:      []byte(`{"customer":"c-7","amount":12500}`),
	})
	span.End()
	if err != nil {
		t.Fatal(err)
	}

	spans := tr.wait(t, 2, "the delivery and its redelivery", processSpan("inv-1"))
	for i, s := range spans {
		if s.SpanContext.TraceID() != producer.TraceID() || s.Parent.SpanID() != producer.SpanID() {
			t.Errorf("span %d in trace %s under %s, want trace %s under the producer's span %s",
				i, s.SpanContext.TraceID(), s.Parent.SpanID(), producer.TraceID(), producer.SpanID())
		}
		wantAttrs(t, s,
			attribute.String("messaging.system", "rabbitmq"),
			attribute.String("messaging.destination.name", topo.Queue),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.consumer.group.name", "billing-invoice"),
		)
	}
	wantAttrs(t, spans[0], attribute.String("idem.outcome", "applied"))
	wantAttrs(t, spans[1], attribute.String("idem.outcome", "duplicate"), attribute.Bool("idem.redelivered", true),
		attribute.String("idem.first_message_id", "inv-1"))
	own := tr.spans(named("INSERT invoices"))
	if len(own) != 1 || own[0].Parent.SpanID() != spans[0].SpanContext.SpanID() {
		t.Errorf("handler spans %s, want one under the applied message's span", names(own))
	}
	if n := d.invoices(t); n != 1 {
		t.Errorf("%d invoices, want 1", n)
	}
}

// TestKafkaConsumerUnderProducerTrace: the same through Kafka (kfake):
// the trace context travels in the record headers; the consumer's span is
// under the producer's, with the topic, partition and record key; the
// record published again gets a duplicate span in the same trace.
func TestKafkaConsumerUnderProducerTrace(t *testing.T) {
	t.Parallel()
	tr, d := newTraces(t), newDB(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	topic, group := uniqueName(t), uniqueName(t)
	producerClient, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producerClient.Close)
	for _, name := range []string{topic, topic + ".dlq"} {
		resp, err := kadm.NewClient(producerClient).CreateTopic(t.Context(), 1, 1, nil, name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating topic %s: %v", name, err)
		}
	}

	p := d.processor(t, "ledger-post", nil, []idem.Hook{tr.tracer(idemotel.Kafka, idemotel.WithConsumerGroup(group))})
	cl, err := kgo.NewClient(append(idemkafka.GroupOptions(group, topic),
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		// The group timeouts of the root module's tests (internal/kafkatest,
		// out of this module's reach): a session longer than the rebalance
		// timeout, so that a rejoining member is never dropped while it
		// waits.
		kgo.SessionTimeout(8*time.Second), kgo.RebalanceTimeout(6*time.Second),
		kgo.HeartbeatInterval(300*time.Millisecond), kgo.RequestTimeoutOverhead(5*time.Second),
		kgo.FetchMaxWait(100*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	c, err := idemkafka.NewConsumer(cl, p, &idemkafka.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c.Run)

	ctx, span := tr.tp.Tracer("ledger").Start(t.Context(), "send "+topic, trace.WithSpanKind(trace.SpanKindProducer))
	producer := span.SpanContext()
	rec := idemkafka.NewRecord(topic, "post-1", []byte("acct-7"), []byte(`{"amount":12500}`))
	idemotel.InjectFunc(ctx, func(k, v string) {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	})
	span.End()
	for i := range 2 { // published twice: a producer's retry after a lost ack
		again := *rec
		if err := producerClient.ProduceSync(t.Context(), &again).FirstErr(); err != nil {
			t.Fatalf("producing copy %d: %v", i, err)
		}
	}

	spans := tr.wait(t, 2, "both copies", processSpan("post-1"))
	for i, s := range spans {
		if s.SpanContext.TraceID() != producer.TraceID() || s.Parent.SpanID() != producer.SpanID() {
			t.Errorf("span %d in trace %s under %s, want trace %s under the producer's span %s",
				i, s.SpanContext.TraceID(), s.Parent.SpanID(), producer.TraceID(), producer.SpanID())
		}
		wantAttrs(t, s,
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", topic),
			attribute.String("messaging.destination.partition.id", "0"),
			attribute.String("messaging.kafka.message.key", "acct-7"),
			attribute.String("messaging.consumer.group.name", group),
			attribute.String("idem.consumer", "ledger-post"),
		)
	}
	outcomes := map[string]int{}
	for _, s := range spans {
		outcomes[attr(s, idemotel.OutcomeKey).AsString()]++
	}
	if outcomes["applied"] != 1 || outcomes["duplicate"] != 1 {
		t.Errorf("outcomes %v, want one applied and one duplicate", outcomes)
	}
	if n := d.invoices(t); n != 1 {
		t.Errorf("%d invoices, want 1", n)
	}
	// Two copies fetched together are one batch: its span, if there is
	// one, links to the producer's span.
	for _, b := range tr.spans(func(s tracetest.SpanStub) bool { return hasAttr(s, "messaging.batch.message_count") }) {
		for _, l := range b.Links {
			if l.SpanContext.SpanID() != producer.SpanID() {
				t.Errorf("batch span links to %s, want the producer's span", l.SpanContext.SpanID())
			}
		}
	}
}
