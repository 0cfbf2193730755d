package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/bench/peers/report"
	"github.com/idemkit/idem/pgxinbox"
)

// Msg is one delivery of the workload.
type Msg struct {
	ID   string
	Body []byte
}

// Workload is the messages every consumer of a run drains: Unique distinct
// messages, then Dups copies of some of them (redeliveries under their own
// IDs) mixed in among the later ones.
type Workload struct {
	Msgs   []Msg
	Unique int
	Dups   int
	Total  int64 // the sum of the distinct credits: the ledger's total after exactly-once
}

// NewWorkload makes n messages with random (v4) UUIDs crediting 1..Accounts,
// and dups redeliveries of earlier messages placed at random later positions.
func NewWorkload(n, dups int) *Workload {
	w := &Workload{Unique: n, Dups: dups}
	for i := range n {
		id := uuid4()
		// Accounts scattered (7919 is prime), as a stream of payments
		// credits merchants in no order.
		c := Credit{Account: int32(i*7919%Accounts + 1), Amount: int64(100 + i%900)}
		w.Total += c.Amount
		w.Msgs = append(w.Msgs, Msg{ID: id, Body: fmt.Appendf(nil, `{"account":%d,"amount":%d}`, c.Account, c.Amount)})
	}
	for range dups {
		// A copy of message i goes somewhere after it: the redelivery of a
		// message whose ack was lost.
		i := randInt(n)
		at := i + 1 + randInt(len(w.Msgs)-i)
		w.Msgs = append(w.Msgs[:at], append([]Msg{w.Msgs[i]}, w.Msgs[at:]...)...)
	}
	return w
}

func randInt(n int) int {
	if n <= 0 {
		return 0
	}
	v, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
	if err != nil {
		panic(err)
	}
	return int(v.Int64())
}

func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// Env is what a consumer is given for one run.
type Env struct {
	Pool      *pgxpool.Pool
	Store     *pgxinbox.Store // the idem inbox
	Consumer  string          // the consumer's name: its inbox scope and its effects' label
	Source    string          // the queue or topic holding the workload
	Batch     int             // messages per transaction for the batched consumers
	Prefetch  int             // deliveries in flight (RabbitMQ prefetch; Kafka max poll records; JetStream MaxAckPending)
	AMQPURL   string
	Kafka     []string // seed brokers
	NATSURL   string   // empty: the embedded server
	RedisAddr string

	acked atomic.Int64
	// first is when the first ack went out (Unix nanoseconds), and
	// firstN how many deliveries it settled.
	first, firstN atomic.Int64
	want          int64
	done          chan struct{}
}

// Acked tells the runner that n more deliveries were acked (RabbitMQ) or
// had their offsets committed (Kafka), only after their effects committed.
func (e *Env) Acked(n int) {
	if e.first.CompareAndSwap(0, time.Now().UnixNano()) {
		e.firstN.Store(int64(n))
	}
	if e.acked.Add(int64(n)) >= e.want {
		select {
		case <-e.done:
		default:
			close(e.done)
		}
	}
}

// Consumer is one way of consuming the workload.
type Consumer struct {
	Key     string // short name: "handrolled-batch"
	Name    string // the table's row: "hand-rolled batched inbox"
	Guarded bool   // whether it guards against redeliveries
	// Run consumes e.Source until ctx is cancelled, calling e.Acked after
	// each ack or offset commit, and returns nil on cancellation.
	Run func(ctx context.Context, e *Env) error
}

// Broker is one broker and the consumers measured on it.
type Broker struct {
	Name string
	// Prepare creates a fresh source for a run and publishes w to it
	// (untimed); it returns the source's name and a cleanup.
	Prepare   func(ctx context.Context, cfg *Options, run string, w *Workload) (source string, cleanup func(), err error)
	Consumers []Consumer
}

// Options are a run's settings.
type Options struct {
	Messages  int
	Dups      int
	Batch     int
	Prefetch  int
	AMQPURL   string
	Kafka     []string // empty: an in-process kfake cluster
	NATSURL   string   // empty: an embedded nats-server
	RedisAddr string
	Timeout   time.Duration
	// Settle is how long a run waits after publishing before it starts
	// the consumer: the broker done writing what it confirmed.
	Settle time.Duration
}

// Result is one consumer's run.
type Result = report.Result

// Bench is a run's database and settings.
type Bench struct {
	Pool  *pgxpool.Pool
	Store *pgxinbox.Store
	Opts  Options
}

// Run measures c on b: a fresh source with w published, the tables reset,
// then the consumer's rate from its first ack to its last (connecting,
// declaring and joining a group are not timed: a real Kafka delays a new
// group's first assignment by seconds), and the check of what it left.
func (bn *Bench) Run(ctx context.Context, b *Broker, c Consumer, w *Workload, iteration int) Result {
	pool, opts := bn.Pool, &bn.Opts
	res := Result{Broker: b.Name, Key: c.Key, Consumer: c.Name, Guarded: c.Guarded, Messages: len(w.Msgs), Iteration: iteration}
	fail := func(err error) Result { res.Error = err.Error(); return res }
	if err := Reset(ctx, pool); err != nil {
		return fail(err)
	}
	run := fmt.Sprintf("peers-%s-%s-%d", b.Name, c.Key, time.Now().UnixNano())
	source, cleanup, err := b.Prepare(ctx, opts, run, w)
	if err != nil {
		return fail(fmt.Errorf("publishing the workload: %w", err))
	}
	defer cleanup()
	// Each run starts from the same quiet state: no checkpoint of the
	// previous run's writes under way (a superuser's CHECKPOINT; others
	// skip it), and the broker done writing the workload it confirmed.
	_, _ = pool.Exec(ctx, `CHECKPOINT`)
	time.Sleep(opts.Settle)
	e := &Env{Pool: pool, Store: bn.Store, Consumer: run, Source: source, Batch: opts.Batch, Prefetch: opts.Prefetch,
		AMQPURL: opts.AMQPURL, Kafka: opts.Kafka, NATSURL: opts.NATSURL, RedisAddr: opts.RedisAddr, want: int64(len(w.Msgs)), done: make(chan struct{})}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- c.Run(rctx, e) }()
	var elapsed time.Duration
	var end time.Time
	select {
	case <-e.done:
		end = time.Now()
		elapsed = end.Sub(start)
		cancel()
		if err := <-errc; err != nil {
			return fail(fmt.Errorf("stopping: %w", err))
		}
	case err := <-errc:
		cancel()
		if err == nil {
			err = fmt.Errorf("returned after %d of %d deliveries", e.acked.Load(), e.want)
		}
		return fail(err)
	case <-time.After(opts.Timeout):
		cancel()
		<-errc
		return fail(fmt.Errorf("timed out after %v with %d of %d deliveries acked", opts.Timeout, e.acked.Load(), e.want))
	}
	res.Seconds = elapsed.Seconds()
	res.Rate = float64(len(w.Msgs)) / elapsed.Seconds()
	if first, n := time.Unix(0, e.first.Load()), e.firstN.Load(); n < e.want {
		res.Rate = float64(e.want-n) / end.Sub(first).Seconds()
	}
	if res.Check, err = Verify(ctx, pool, run, w); err != nil {
		return fail(err)
	}
	res.OK = res.Check.ExactlyOnce()
	if c.Guarded && !res.OK {
		res.Error = fmt.Sprintf("not exactly once: %d applied, %d doubled, %d missing, ledger ok %v",
			res.Check.Applied, res.Check.Doubled, res.Check.Missing, res.Check.Balance)
	}
	return res
}
