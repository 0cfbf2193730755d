package dlq

import (
	"github.com/idemkit/idem/idembroker"

	"context"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkRabbitMQ is the cost per letter of reading a DLQ (peek) and of
// redriving it (one confirmed republish and one ack per letter, no rate
// limit), on the same queue in the same run: compare the two as a ratio.
func BenchmarkRabbitMQ(b *testing.B) {
	const letters = 200
	for _, op := range []string{"peek", "redrive"} {
		b.Run(op, func(b *testing.B) {
			e := newBenchEnv(b)
			ctx := context.Background()
			for b.Loop() {
				b.StopTimer()
				e.fill(b, letters)
				b.StartTimer()
				var err error
				if op == "peek" {
					_, err = e.src.Peek(ctx, 0)
				} else {
					var res Result
					res, err = Redrive(ctx, e.src, nil, Selection{Apply: true})
					if err == nil && res.Done != letters {
						err = fmt.Errorf("redrove %d of %d", res.Done, letters)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				e.empty(b)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*letters), "ns/letter")
		})
	}
}

type benchEnv struct {
	conn       *amqp.Connection
	queue, dlq string
	src        *RabbitMQ
}

func newBenchEnv(b *testing.B) *benchEnv {
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	q := uniqueName(b)
	for _, n := range []string{q, q + ".dlq"} {
		if _, err := ch.QueueDeclare(n, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_, _ = ch.QueueDelete(q+".dlq", false, false, false)
		}
	})
	src, err := NewRabbitMQ(RabbitMQConfig{URL: amqpURL(), Queue: q + ".dlq"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = src.Close() })
	return &benchEnv{conn: conn, queue: q, dlq: q + ".dlq", src: src}
}

func (e *benchEnv) fill(b *testing.B, n int) {
	ch, err := e.conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	var last *amqp.DeferredConfirmation
	for i := range n {
		last, err = ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.dlq, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("m-%d", i), Body: []byte(`{}`), DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{idembroker.HeaderReason: "boom", idembroker.HeaderConsumer: "c", idembroker.HeaderOrigin: e.queue},
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if ok, err := last.WaitContext(context.Background()); !ok || err != nil {
		b.Fatalf("confirm %v %v", ok, err)
	}
	for {
		q, err := ch.QueueDeclarePassive(e.dlq, true, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		if q.Messages >= n {
			return
		}
	}
}

func (e *benchEnv) empty(b *testing.B) {
	ch, err := e.conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	for _, q := range []string{e.queue, e.dlq} {
		if _, err := ch.QueuePurge(q, false); err != nil {
			b.Fatal(err)
		}
	}
}
