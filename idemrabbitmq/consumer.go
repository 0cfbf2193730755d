package idemrabbitmq

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// Consumer consumes one RabbitMQ queue into a [idem.Processor]: it acks a
// delivery only after the transaction that applied it committed, reconnects
// by itself, and publishes dead letters to a destination it checked at
// start. Create it with [NewConsumer] and start it with [Consumer.Run].
type Consumer[TTx any] struct {
	proc *idem.Processor[TTx]
	cfg  Config
	// settler keeps health and calls the hooks: the processor's, then the
	// consumer's own.
	settler *idembroker.Settler
	// reconnectBackoff is Config.ReconnectBackoff, with its defaults:
	// capped exponential backoff with jitter, so consumers that failed
	// together do not come back together.
	reconnectBackoff idem.Backoff
	// brokers and dlBrokers choose the node of the consuming and of the
	// dead-letter connection.
	brokers, dlBrokers *nodes

	running atomic.Bool
	mu      sync.Mutex
	sock    net.Conn // the current session's consuming socket, for DropConnection

	stats struct {
		delivered, redelivered, applied, duplicates, requeued, held, deadLettered, reconnects atomic.Uint64
	}
	health   *idembroker.HealthState
	inFlight atomic.Int64 // deliveries of the current session not settled
}

// Stats counts what a consumer did since it was created. Settlement counts
// (Applied, Duplicates, Requeued, DeadLettered) grow only when the frame
// reached the broker's socket.
type Stats struct {
	// Delivered counts deliveries received; Redelivered those the broker
	// flagged as redelivered.
	Delivered, Redelivered uint64
	// Applied and Duplicates count acked deliveries by outcome.
	Applied, Duplicates uint64
	// Requeued counts nacks with requeue; DeadLettered counts dead letters
	// confirmed at the dead-letter destination (and their originals acked).
	Requeued, DeadLettered uint64
	// Held counts deliveries kept unacked to be processed again, once per
	// time they were held.
	Held uint64
	// Reconnects counts sessions that ended while Run went on.
	Reconnects uint64
}

// ErrRunning is returned by [Consumer.Run] when the consumer already runs.
var ErrRunning = errors.New("consumer is already running")

// NewConsumer returns a consumer of cfg.Queue into proc. It applies cfg's
// defaults and returns an error wrapping [ErrConfig] when cfg is invalid. It
// does not connect; [Consumer.Run] does.
func NewConsumer[TTx any](proc *idem.Processor[TTx], cfg *Config) (*Consumer[TTx], error) {
	if proc == nil {
		return nil, fmt.Errorf("%w: processor is nil", ErrConfig)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: config is nil", ErrConfig)
	}
	c := *cfg
	c.setDefaults(proc.Consumer())
	if err := c.validate(); err != nil {
		return nil, err
	}
	// The settler logs the end of an outage's hold.
	settler := idembroker.NewSettler(proc.Consumer(), c.Queue, append(slices.Clip(proc.Hooks()), c.Hooks...), c.Logger.With(slog.String("queue", c.Queue)))
	return &Consumer[TTx]{
		proc: proc, cfg: c, settler: settler,
		reconnectBackoff: c.ReconnectBackoff,
		health:           settler.Health(),
		brokers:          newNodes(nodeURLs(c.URL, c.URLs)),
		dlBrokers:        newNodes(nodeURLs(c.DeadLetterURL, c.DeadLetterURLs)),
	}, nil
}

// Stats returns the consumer's counters.
func (c *Consumer[TTx]) Stats() Stats {
	s := &c.stats
	return Stats{
		Delivered: s.delivered.Load(), Redelivered: s.redelivered.Load(),
		Applied: s.applied.Load(), Duplicates: s.duplicates.Load(),
		Requeued: s.requeued.Load(), DeadLettered: s.deadLettered.Load(),
		Held: s.held.Load(), Reconnects: s.reconnects.Load(),
	}
}

// DropConnection cuts the current consuming connection at the socket, as a
// network failure or a broker crash would: nothing more is acked on it, the
// broker requeues every delivery not acked yet, and Run reconnects after its
// backoff. It is meant for tests and drills (watch a consumer survive the
// incident a broker restart causes) and reports whether a connection was
// open.
func (c *Consumer[TTx]) DropConnection() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sock == nil {
		return false
	}
	_ = c.sock.Close()
	c.sock = nil
	return true
}

// Run consumes until ctx is cancelled, then shuts down gracefully: no new
// batch starts, batches in flight finish (or, after [Config.ShutdownGrace],
// roll back), what committed is acked, and the connections close; Run then
// returns nil.
//
// Before it takes a message, Run checks the inbox ([idem.Processor.Check])
// and the dead-letter destination, and returns an error when either is not
// ready: one wrapping [idem.ErrInboxNotReady] for an inbox table that is
// missing or not writable, one wrapping [ErrNoDeadLetterDestination] for
// dead letters that would have nowhere to go. An inbox database that is
// only unreachable (the check's error wraps [idem.ErrUnavailable]) is
// waited for, with the reconnect backoff. It also returns an error when
// the broker refuses the queue (404 not found, 403 access refused) before
// the first successful consume. Any other lost connection or channel is
// re-established with backoff, on the next node of [Config.URLs]; tags of
// the lost channel are forgotten, never acked on the new one.
//
// What becomes of each message is the processor's decision
// ([idem.Processor.Dispose]), mapped to broker verbs by [VerbFor]. A
// delivery held because its Retry was not its fault (the inbox database
// unreachable or not set up, for longer than the processor's
// RetryPolicy.WaitUnavailable) is processed again in this session after
// the disposition's delay, while no new batch starts, until it settles: a
// quorum queue counts every requeue towards its delivery limit, and an
// outage must not dead-letter healthy messages. A shutdown or a lost
// connection leaves held deliveries to the broker, which requeues them.
// RabbitMQ's consumer_timeout (30 minutes by default) closes a channel
// whose delivery stays unacked longer; the consumer then reconnects and
// the broker redelivers, so a long outage costs at most one delivery per
// consumer_timeout.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)
	c.health.Start(time.Now())
	defer func() { c.health.Stop(time.Now()) }()
	log := c.cfg.Logger.With(slog.String("consumer", c.proc.Consumer()), slog.String("queue", c.cfg.Queue))
	if err := c.check(ctx, log); err != nil || ctx.Err() != nil {
		// Stopped while waiting for the inbox: nothing was consumed, and
		// nothing may be (no connection, no delivery taken).
		return err
	}
	failures := 0 // sessions ended since the last one that consumed
	everConsumed := false
	for {
		consumed, err := c.session(ctx, log)
		c.inFlight.Store(0)
		c.health.Disconnect(err, time.Now())
		if ctx.Err() != nil {
			if err != nil {
				log.Info("consumer stopped", slog.Any("error", err))
			}
			return nil
		}
		if consumed {
			everConsumed = true
			failures = 0
		}
		failures++
		if !everConsumed && refused(err) {
			return fmt.Errorf("consuming queue %s: %w", c.cfg.Queue, err)
		}
		c.stats.reconnects.Add(1)
		c.settler.Reconnect(c.cfg.Queue, err)
		wait := c.reconnectBackoff.Delay(failures)
		log.Warn("broker session ended; reconnecting", slog.Any("error", err), slog.Duration("backoff", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// check runs the processor's inbox check until it passes, ctx ends (nil),
// or it fails for a reason waiting cannot fix (the error). A database
// that is only unreachable ([idem.ErrUnavailable]) is waited for.
func (c *Consumer[TTx]) check(ctx context.Context, log *slog.Logger) error {
	for tries := 1; ; tries++ {
		err := c.proc.Check(ctx)
		switch {
		case err == nil:
			c.health.Reachable(time.Now())
			return nil
		case ctx.Err() != nil:
			return nil
		case !errors.Is(err, idem.ErrUnavailable):
			return fmt.Errorf("consuming queue %s: %w", c.cfg.Queue, err)
		}
		c.health.Unreachable(err, time.Now())
		wait := c.reconnectBackoff.Delay(tries)
		log.Warn("inbox database unreachable at start; checking again", slog.Any("error", err), slog.Duration("backoff", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// refused reports a broker refusal that reconnecting cannot fix.
func refused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && (ae.Code == amqp.NotFound || ae.Code == amqp.AccessRefused)
}

// dial connects to url as the named connection, and returns the socket
// too, so that it can be cut even when the connection is blocked.
func (c *Consumer[TTx]) dial(url, name string) (*amqp.Connection, net.Conn, error) {
	var ac amqp.Config
	if c.cfg.AMQP != nil {
		ac = *c.cfg.AMQP
	}
	props := amqp.NewConnectionProperties()
	for k, v := range ac.Properties {
		props[k] = v
	}
	props.SetClientConnectionName(name)
	ac.Properties = props
	dial := ac.Dial
	if dial == nil {
		dial = amqp.DefaultDial(30 * time.Second)
	}
	var sock net.Conn
	ac.Dial = func(network, addr string) (net.Conn, error) {
		s, err := dial(network, addr)
		sock = s
		return s, err
	}
	conn, err := amqp.DialConfig(url, ac)
	if err != nil {
		// A URI that does not parse is quoted whole in the error.
		return nil, nil, idembroker.RedactError(err, url)
	}
	return conn, sock, nil
}

// closeTimeout bounds a graceful connection close: a broker that stopped
// answering (or blocks the connection) never sends close-ok.
const closeTimeout = time.Second

// closeConn closes conn, cutting its socket if the broker does not answer
// within closeTimeout.
func closeConn(conn *amqp.Connection, sock net.Conn) {
	t := time.AfterFunc(closeTimeout, func() {
		if sock != nil {
			_ = sock.Close()
		}
	})
	defer t.Stop()
	_ = conn.Close()
}

// completion is a processed batch on its way back to the session loop.
type completion struct {
	batch     pending
	decisions []decision // one per delivery of batch
	err       error      // ends the session without settling the batch
}

// publication is a dead-letter publish on its way back to the loop.
type publication struct {
	letters []letter
	err     error
}

// session is one consuming connection and channel, and one dead-letter
// connection. It returns whether it consumed, and why it ended (nil after
// a graceful shutdown).
func (c *Consumer[TTx]) session(ctx context.Context, log *slog.Logger) (consumed bool, err error) {
	// Batches run on a context of their own so that a shutdown or a lost
	// connection lets them reach their commit; ShutdownGrace later they
	// are cancelled.
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownGrace, cancel) })
	defer stopGrace()

	dl, err := c.openDeadLetters(log)
	if err != nil {
		return false, err
	}
	conn, sock, node, err := c.brokers.dial(func(url string) (*amqp.Connection, net.Conn, error) {
		return c.dial(url, c.cfg.ConnectionName)
	})
	if err != nil {
		dl.close()
		return false, fmt.Errorf("connecting: %w", err)
	}
	defer func() {
		if err != nil {
			// The next session starts on the nodes after these: when
			// one died, the reconnect goes to a survivor first.
			c.brokers.ended(node)
			c.dlBrokers.ended(dl.node)
		}
	}()
	c.mu.Lock()
	c.sock = sock
	c.mu.Unlock()
	var wg sync.WaitGroup
	defer func() {
		// Nothing is acked after this point: the tags die with the
		// connection. Workers still in the database go on to their commit
		// (redelivery finds their markers), for at most ShutdownGrace.
		c.mu.Lock()
		c.sock = nil
		c.mu.Unlock()
		closeConn(conn, sock)
		t := time.AfterFunc(c.cfg.ShutdownGrace, cancel)
		wg.Wait()
		t.Stop()
		dl.close()
	}()
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("opening channel: %w", err)
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("setting prefetch: %w", err)
	}
	tag := c.cfg.ConnectionName + "-" + randomHex(6)
	deliveries, err := ch.Consume(c.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("starting consumer: %w", err)
	}
	c.health.Connect(time.Now())
	log.Info("consuming", slog.String("consumer_tag", tag), slog.String("node", c.brokers.addr(node)), slog.Int("prefetch", c.cfg.Prefetch),
		slog.String("dead_letter_queue", c.cfg.DeadLetterQueue))

	l := &loop[TTx]{
		c: c, ch: ch, dl: dl, log: log, wg: &wg, bctx: bctx, s: newSession(&c.cfg),
		batches:      make(chan pending, c.cfg.Workers),
		completions:  make(chan completion, c.cfg.Workers),
		publications: make(chan publication, 1),
	}
	l.startWorkers(c.cfg.Workers)
	defer close(l.batches)
	return true, l.run(ctx, tag, deliveries, connClosed, chClosed)
}

// loop is the single goroutine that owns a session's channel and state:
// every frame to the broker about a delivery is sent from here. It turns
// broker and worker events into calls on the [session] and carries out
// what the session returns.
type loop[TTx any] struct {
	c            *Consumer[TTx]
	ch           *amqp.Channel
	dl           *deadLetters
	log          *slog.Logger
	wg           *sync.WaitGroup
	bctx         context.Context
	s            *session
	batches      chan pending // to the workers; at most Workers are out at once
	completions  chan completion
	publications chan publication
}

func (l *loop[TTx]) run(ctx context.Context, tag string, deliveries <-chan amqp.Delivery, connClosed, chClosed <-chan *amqp.Error) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	armed := time.Time{} // when timer fires; zero when stopped
	done := ctx.Done()
	for {
		wake := l.dispatch()
		if l.s.done() {
			return nil
		}
		if !wake.Equal(armed) {
			// The timer is reset only when the wake-up moved: gathering a
			// batch sets it once, not once per delivery.
			timer.Stop()
			if !wake.IsZero() {
				timer.Reset(time.Until(wake))
			}
			armed = wake
		}
		in := deliveries
		if !l.s.intake() {
			in = nil
		}
		var ops []op
		select {
		case d, ok := <-in:
			if !ok {
				return errClosedDeliveries
			}
			l.take(&d)
			if err := l.gather(in); err != nil {
				return err
			}
		case <-timer.C:
			armed = time.Time{}
			ops = l.s.tick(time.Now())
		case r := <-l.completions:
			if r.err != nil {
				return r.err
			}
			ops = l.s.finished(r.batch, r.decisions, time.Now())
			// The worker gets its next batch before the acks go out: the
			// acks are of a batch that committed, and the next batch's
			// transaction need not wait for their frames and hooks.
			l.dispatch()
			l.logHeld(r.decisions)
		case p := <-l.publications:
			if p.err != nil {
				l.c.health.Fail(fmt.Errorf("publishing dead letters: %w", p.err), time.Now())
				l.log.Error("publishing dead letters failed; they stay unacked and are published again",
					slog.Int("dead_letters", len(p.letters)), slog.Any("error", p.err))
			}
			ops = l.s.published(p.letters, p.err, time.Now())
		case e, ok := <-l.dl.closed:
			return closedError("dead-letter channel", e, ok)
		case e, ok := <-connClosed:
			return closedError("connection", e, ok)
		case e, ok := <-chClosed:
			return closedError("channel", e, ok)
		case <-done:
			done = nil
			// Stop the flow first; deliveries not yet in a batch are never
			// processed and return to the queue when the channel closes.
			if err := l.ch.Cancel(tag, false); err != nil {
				return fmt.Errorf("cancelling consumer: %w", err)
			}
			ops = l.s.stop(time.Now())
		}
		if err := l.send(ops); err != nil {
			return err
		}
	}
}

var errClosedDeliveries = errors.New("delivery channel closed (consumer cancelled by the broker?)")

// dispatch starts the work the session has for now: batches to the
// workers, dead letters to the publisher. It returns when the loop must
// look again if no event comes first (zero: only an event can change
// anything).
func (l *loop[TTx]) dispatch() time.Time {
	w, wake := l.s.next(time.Now())
	l.c.inFlight.Store(int64(l.s.tr.len()))
	for _, b := range w.batches {
		l.batches <- b
	}
	if len(w.letters) > 0 {
		l.publish(w.letters)
	}
	return wake
}

// gather takes what the client has already received, up to a full batch,
// before the loop looks at anything else: one select per delivery over
// every event costs more than the delivery.
func (l *loop[TTx]) gather(in <-chan amqp.Delivery) error {
	for l.s.intake() {
		select {
		case d, ok := <-in:
			if !ok {
				return errClosedDeliveries
			}
			l.take(&d)
		default:
			return nil
		}
	}
	return nil
}

// take adds a delivery to the batch being gathered.
func (l *loop[TTx]) take(d *amqp.Delivery) {
	cfg := &l.c.cfg
	l.c.stats.delivered.Add(1)
	if d.Redelivered {
		l.c.stats.redelivered.Add(1)
		l.c.settler.Redelivered(cfg.Queue)
	}
	l.s.deliver(*d, Message(d, cfg.Queue, cfg.IDHeader), time.Now())
}

func closedError(what string, e *amqp.Error, ok bool) error {
	if !ok || e == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s closed: %w", what, e)
}

// startWorkers starts the session's n workers. Each processes the
// batches it is handed, one at a time, until batches is closed; a worker
// that lives as long as the session keeps its grown stack and costs no
// goroutine per batch.
func (l *loop[TTx]) startWorkers(n int) {
	l.wg.Add(n)
	for range n {
		go func() {
			defer l.wg.Done()
			for b := range l.batches {
				l.completions <- l.work(b)
			}
		}()
	}
}

// work processes a batch and decides each message's fate through the
// processor's Dispose. It runs off the loop, so it must not touch the
// session or send frames on the consuming channel.
func (l *loop[TTx]) work(b pending) completion {
	busy := l.c.health.Begin(time.Now())
	results := l.c.proc.ProcessBatch(l.bctx, b.msgs)
	l.c.health.End(busy, time.Now())
	r := completion{batch: b, decisions: make([]decision, len(results))}
	for i, res := range results {
		r.decisions[i] = decide(res.Disposition, res)
	}
	if f := l.c.cfg.Faults; f != nil {
		if err := f(l.bctx, BeforeSettle, b.msgs); err != nil {
			r.err = fmt.Errorf("withholding settlement (fault at %s): %w", BeforeSettle, err)
		}
	}
	return r
}

// publish hands dead letters to the dead-letter connection, off the loop.
func (l *loop[TTx]) publish(ls []letter) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		err := l.dl.publish(l.bctx, ls)
		dest := l.dl.key
		if l.dl.exchange != "" {
			dest = l.dl.exchange + "/" + l.dl.key
		}
		for i := range ls {
			l.c.settler.DeadLetter(dest, ls[i].d.res, err)
		}
		l.publications <- publication{letters: ls, err: err}
	}()
}

// logHeld logs, once per batch, deliveries held for an outage.
func (l *loop[TTx]) logHeld(ds []decision) {
	n, first := 0, -1
	for i := range ds {
		if ds[i].verb == Hold {
			if !l.s.stopping {
				l.c.health.Settle(ds[i].disp, ds[i].res, time.Now())
			}
			n++
			if first < 0 {
				first = i
			}
		}
	}
	if n == 0 {
		return
	}
	l.c.stats.held.Add(uint64(n))
	if l.s.stopping {
		return
	}
	l.log.Warn("holding deliveries whose retry is not their fault; processing them again after a delay",
		slog.Int("held", n), slog.Duration("delay", ds[first].disp.Delay.Round(time.Millisecond)), slog.String("reason", ds[first].disp.Reason))
}

// send writes frames to the broker, then counts and reports them.
func (l *loop[TTx]) send(ops []op) error {
	cfg := &l.c.cfg
	st := &l.c.stats
	var now time.Time
	if len(ops) > 0 {
		now = time.Now()
	}
	for _, o := range ops {
		var err error
		switch o.verb {
		case Ack:
			err = l.ch.Ack(o.tag, o.multiple)
		default:
			err = l.ch.Nack(o.tag, false, true)
		}
		if err != nil {
			return fmt.Errorf("sending %s for tag %d: %w", o.verb, o.tag, err)
		}
		for _, d := range o.settled {
			switch {
			case d.verb == Requeue:
				st.requeued.Add(1)
			case d.verb == DeadLetter:
				st.deadLettered.Add(1)
			case d.res.Outcome == idem.Duplicate:
				st.duplicates.Add(1)
			default:
				st.applied.Add(1)
			}
			l.c.settler.Settle(cfg.Queue, d.disp, d.res, now)
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}
