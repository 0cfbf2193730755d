package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/pgxinbox"
)

var quiet = slog.New(slog.DiscardHandler)

// enqueue commits n rows for dest (a queue on the default exchange, or a
// topic), 100 a transaction, over keys keys.
func enqueue(b *testing.B, p *pipeline, n, keys int, kafka bool, dest string) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < n; i += 100 {
		tx, err := p.pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		msgs := make([]outbox.Message, 0, 100)
		for j := i; j < min(i+100, n); j++ {
			m := outbox.Message{Key: "k" + strconv.Itoa(j%keys), Body: []byte(`{"n":` + strconv.Itoa(j) + `}`)}
			if kafka {
				m.Destination = dest
			} else {
				m.DefaultExchange, m.RoutingKey = true, dest
			}
			msgs = append(msgs, m)
		}
		if _, err := p.ob.Enqueue(ctx, tx, msgs...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// kafkaTopic starts kfake with a four-partition topic.
func kafkaTopic(b *testing.B) (brokers []string, topic string) {
	b.Helper()
	c := kafkatest.NewCluster(b)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	topic = "events"
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 4, 1, nil, topic); err != nil {
		b.Fatal(err)
	}
	return c.ListenAddrs(), topic
}

// BenchmarkRelayThroughput drains b.N committed rows to RabbitMQ (publisher
// confirms, a durable queue) and to Kafka (kfake, acks from all in-sync
// replicas), with the outbox relay and with a hand-rolled relay loop: in
// one transaction SELECT … FOR UPDATE SKIP LOCKED LIMIT 100, publish, wait
// for the confirms, DELETE, COMMIT. The rows are committed before the
// timer starts, over 100 keys or 10 (with 10, a batch of 100 holds ten
// records of each key, which the RabbitMQ publisher sends one confirm
// round trip apart to keep their order; the hand-rolled loop does not keep
// order when a record fails).
//
//	go test -run '^$' -bench BenchmarkRelayThroughput -benchtime 5000x ./outbox/e2e/
func BenchmarkRelayThroughput(b *testing.B) {
	for _, broker := range []string{"rabbitmq", "kafka"} {
		for _, keys := range []int{100, 10} {
			for _, relay := range []string{"outbox", "hand-rolled"} {
				b.Run(fmt.Sprintf("%s/keys=%d/%s", broker, keys, relay), func(b *testing.B) {
					benchThroughput(b, broker, keys, relay)
				})
			}
		}
	}
}

func benchThroughput(b *testing.B, broker string, keys int, relay string) {
	p := newPipeline(b)
	ctx := context.Background()
	var (
		pub      outbox.Publisher
		handRoll func([]handRow) error
		dest     string
	)
	switch broker {
	case "rabbitmq":
		dest = p.queueB
		conn, err := amqp.Dial(amqpURL())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		ap, err := amqppub.New(conn, nil)
		if err != nil {
			b.Fatal(err)
		}
		pub = ap
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		handRoll = func(rows []handRow) error {
			dcs := make([]*amqp.DeferredConfirmation, 0, len(rows))
			for _, r := range rows {
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", r.routingKey, true, false, amqp.Publishing{
					MessageId: r.id, Timestamp: r.eventTime, DeliveryMode: amqp.Persistent, Body: r.body})
				if err != nil {
					return err
				}
				dcs = append(dcs, dc)
			}
			for _, dc := range dcs {
				if ok, err := dc.WaitContext(ctx); err != nil || !ok {
					return fmt.Errorf("confirm: %v %v", ok, err)
				}
			}
			return nil
		}
	case "kafka":
		brokers, topic := kafkaTopic(b)
		dest = topic
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, kafkapub.ProducerOptions()...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cl.Close)
		kp, err := kafkapub.New(cl, nil)
		if err != nil {
			b.Fatal(err)
		}
		pub = kp
		hand, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(hand.Close)
		handRoll = func(rows []handRow) error {
			recs := make([]*kgo.Record, len(rows))
			for i, r := range rows {
				recs[i] = &kgo.Record{Topic: r.destination, Key: []byte(r.key), Value: r.body, Timestamp: r.eventTime,
					Headers: []kgo.RecordHeader{{Key: idemkafka.DefaultIDHeader, Value: []byte(r.id)}}}
			}
			return hand.ProduceSync(ctx, recs...).FirstErr()
		}
	}
	enqueue(b, p, b.N, keys, broker == "kafka", dest)
	b.ResetTimer()
	switch relay {
	case "outbox":
		r, err := outbox.NewRelay(p.ob, pub, &outbox.RelayConfig{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		ran := make(chan error, 1)
		go func() { ran <- r.Run(rctx) }()
		for r.Published() < int64(b.N) {
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		cancel()
		if err := <-ran; err != nil {
			b.Fatal(err)
		}
	case "hand-rolled":
		for done := 0; done < b.N; {
			n, err := handRolledPass(ctx, p.pool, handRoll)
			if err != nil {
				b.Fatal(err)
			}
			done += n
		}
		b.StopTimer()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// handRow is a row as the hand-rolled loop reads it.
type handRow struct {
	seq                              int64
	id, destination, routingKey, key string
	body                             []byte
	eventTime                        time.Time
}

// handRolledPass is one pass of the loop many services write: lock a batch,
// publish it, wait for the broker, delete it, all in one transaction held
// open while the broker works.
func handRolledPass(ctx context.Context, pool *pgxpool.Pool, publish func([]handRow) error) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `SELECT seq, id, destination, routing_key, key, body, event_time FROM idem_outbox
WHERE sent_at IS NULL ORDER BY seq FOR UPDATE SKIP LOCKED LIMIT 100`)
	if err != nil {
		return 0, err
	}
	batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (handRow, error) {
		var h handRow
		err := r.Scan(&h.seq, &h.id, &h.destination, &h.routingKey, &h.key, &h.body, &h.eventTime)
		return h, err
	})
	if err != nil {
		return 0, err
	}
	if len(batch) == 0 {
		return 0, nil
	}
	if err := publish(batch); err != nil {
		return 0, err
	}
	seqs := make([]int64, len(batch))
	for i, h := range batch {
		seqs[i] = h.seq
	}
	if _, err := tx.Exec(ctx, `DELETE FROM idem_outbox WHERE seq = ANY($1)`, seqs); err != nil {
		return 0, err
	}
	return len(batch), tx.Commit(ctx)
}

// BenchmarkEndToEndLatency measures, one event at a time, from the commit
// that enqueued it to consumer B's commit of its effect: relay (amqppub),
// RabbitMQ with confirms, an idem consumer (batches of one, so that no
// batch wait is counted). The relay is woken by NOTIFY (polling once an
// hour), or polls every 100 ms alone (an outbox on a lone *pgx.Conn, which
// cannot LISTEN). p50 and p99 are reported in milliseconds.
//
//	go test -run '^$' -bench BenchmarkEndToEndLatency -benchtime 200x ./outbox/e2e/
func BenchmarkEndToEndLatency(b *testing.B) {
	for _, mode := range []string{"notify", "poll-100ms"} {
		b.Run(mode, func(b *testing.B) {
			p := newPipeline(b)
			ctx := context.Background()
			relayOutbox := p.ob
			cfg := &outbox.RelayConfig{PollInterval: time.Hour, Logger: quiet}
			if mode != "notify" {
				conn, err := pgx.Connect(ctx, p.url)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = conn.Close(context.Background()) })
				if relayOutbox, err = outbox.NewPgx(conn, nil); err != nil {
					b.Fatal(err)
				}
				cfg.PollInterval = 100 * time.Millisecond
			}
			conn, err := amqp.Dial(amqpURL())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = conn.Close() })
			pub, err := amqppub.New(conn, nil)
			if err != nil {
				b.Fatal(err)
			}
			r, err := outbox.NewRelay(relayOutbox, pub, cfg)
			if err != nil {
				b.Fatal(err)
			}
			applied := make(chan string, 16)
			store, err := pgxinbox.New(p.pool, &pgxinbox.Config{})
			if err != nil {
				b.Fatal(err)
			}
			proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{Consumer: "consumer-b", Key: idem.ByMessageID, Logger: quiet,
				Hooks: []idem.Hook{observerFunc(func(res idem.Result) {
					if res.Outcome == idem.Applied {
						applied <- res.MessageID
					}
				})},
				Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
					_, err := tx.Exec(ctx, `INSERT INTO b_effects (message_id, n, cause) VALUES ($1, 0, '')`, m.ID)
					return err
				}})
			if err != nil {
				b.Fatal(err)
			}
			cons, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: amqpURL(), Queue: p.queueB, BatchSize: 1, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			ran := make(chan error, 2)
			go func() { ran <- r.Run(rctx) }()
			go func() { ran <- cons.Run(rctx) }()
			defer func() {
				cancel()
				for range 2 {
					if err := <-ran; err != nil {
						b.Error(err)
					}
				}
			}()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				tx, err := p.pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				ids, err := p.ob.Enqueue(ctx, tx, outbox.Message{DefaultExchange: true, RoutingKey: p.queueB, Key: "k", Body: []byte("0")})
				if err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				for id := range applied {
					if id == ids[0] {
						break
					}
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			ms := func(q float64) float64 {
				return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Millisecond)
			}
			b.ReportMetric(ms(0.50), "p50-ms")
			b.ReportMetric(ms(0.99), "p99-ms")
		})
	}
}

type observerFunc func(idem.Result)

func (f observerFunc) OnOutcome(_ string, r idem.Result, _ time.Duration) { f(r) }
