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
)

// Consumer consumes one RabbitMQ queue into a [idem.Processor]: it acks a
// delivery only after the transaction that applied it committed, reconnects
// by itself, and sends poison messages to the dead-letter path instead of
// requeueing them forever. Create it with [NewConsumer] and start it with
// [Consumer.Run].
type Consumer[TTx any] struct {
	proc *idem.Processor[TTx]
	cfg  Config
	// requeueBackoff and reconnectBackoff are Config's ranges as idem's
	// retry policy: capped exponential backoff with jitter, so consumers
	// that failed together do not come back together.
	requeueBackoff, reconnectBackoff idem.RetryPolicy
	retries                          *retryCounts

	running atomic.Bool
	mu      sync.Mutex
	sock    net.Conn // the current session's socket, for DropConnection

	stats struct {
		delivered, redelivered, applied, duplicates, requeued, deadLettered, reconnects atomic.Uint64
	}
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
	// (rejected, or republished and acked).
	Requeued, DeadLettered uint64
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
	return &Consumer[TTx]{
		proc: proc, cfg: c,
		requeueBackoff:   idem.RetryPolicy{InitialBackoff: c.RequeueBackoff, MaxBackoff: c.MaxRequeueBackoff},
		reconnectBackoff: idem.RetryPolicy{InitialBackoff: c.ReconnectBackoff, MaxBackoff: c.MaxReconnectBackoff},
		retries:          newRetryCounts(maxCountedMessages),
	}, nil
}

// Stats returns the consumer's counters.
func (c *Consumer[TTx]) Stats() Stats {
	s := &c.stats
	return Stats{
		Delivered: s.delivered.Load(), Redelivered: s.redelivered.Load(),
		Applied: s.applied.Load(), Duplicates: s.duplicates.Load(),
		Requeued: s.requeued.Load(), DeadLettered: s.deadLettered.Load(),
		Reconnects: s.reconnects.Load(),
	}
}

// DropConnection cuts the current broker connection at the socket, as a
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
// roll back), what committed is acked, and the connection closes; Run then
// returns nil. A lost connection or channel is re-established with backoff;
// tags of the lost channel are forgotten, never acked on the new one. Run
// returns an error only when the broker refuses the queue (404 not found,
// 403 access refused) before the first successful consume.
//
// A Retry that is not the message's fault — one the processor marks
// Blameless: the inbox database unreachable for longer than the processor's
// RetryPolicy.WaitUnavailable ([idem.ErrUnavailable]), or processing
// cancelled — is not nacked: a quorum queue counts every requeue towards its delivery limit,
// and an outage would dead-letter healthy messages. The delivery is held
// unacked and processed again in this session after the requeue backoff,
// while no new batch starts, until it settles; a redelivery finds its
// marker if it had committed. A shutdown or a lost connection leaves held
// deliveries to the broker, which requeues them. RabbitMQ's
// consumer_timeout (30 minutes by default) closes a channel whose delivery
// stays unacked longer; the consumer then reconnects and the broker
// redelivers, so a long outage costs at most one delivery per
// consumer_timeout.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)
	log := c.cfg.Logger.With(slog.String("consumer", c.proc.Consumer()), slog.String("queue", c.cfg.Queue))
	failures := 0 // sessions ended since the last one that consumed
	everConsumed := false
	for {
		consumed, err := c.session(ctx, log)
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
		c.cfg.Hooks.Reconnecting(c.cfg.Queue, err)
		wait := c.reconnectBackoff.Backoff(failures)
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

// refused reports a broker refusal that reconnecting cannot fix.
func refused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && (ae.Code == amqp.NotFound || ae.Code == amqp.AccessRefused)
}

// dial connects with the socket kept aside for DropConnection.
func (c *Consumer[TTx]) dial() (*amqp.Connection, error) {
	var ac amqp.Config
	if c.cfg.AMQP != nil {
		ac = *c.cfg.AMQP
	}
	props := amqp.NewConnectionProperties()
	for k, v := range ac.Properties {
		props[k] = v
	}
	props.SetClientConnectionName(c.cfg.ConnectionName)
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
	conn, err := amqp.DialConfig(c.cfg.URL, ac)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.sock = sock
	c.mu.Unlock()
	return conn, nil
}

// pending is a batch being gathered or processed.
type pending struct {
	deliveries []amqp.Delivery
	msgs       []idem.Message
	rerun      bool // deliveries held after a Retry that was not their fault
}

// completion is a processed batch on its way back to the session loop.
type completion struct {
	batch     pending
	decisions []decision // one per delivery of batch
	err       error      // ends the session without settling the batch
}

// session is one connection and channel. It returns whether it consumed,
// and why it ended (nil after a graceful shutdown).
func (c *Consumer[TTx]) session(ctx context.Context, log *slog.Logger) (consumed bool, err error) {
	conn, err := c.dial()
	if err != nil {
		return false, fmt.Errorf("connecting: %w", err)
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	var wg sync.WaitGroup
	defer func() {
		// Nothing is acked after this point: the tags die with the
		// connection, and workers still in the database finish with their
		// results discarded (redelivery finds their markers).
		c.mu.Lock()
		c.sock = nil
		c.mu.Unlock()
		_ = conn.Close()
		wg.Wait()
	}()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("opening channel: %w", err)
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("setting prefetch: %w", err)
	}
	var dl *deadLetterer
	if c.cfg.DeadLetterExchange != "" {
		if dl, err = newDeadLetterer(conn, c.cfg.DeadLetterExchange, c.cfg.DeadLetterRoutingKey, c.proc.Consumer(), c.cfg.Queue); err != nil {
			return false, err
		}
	}
	tag := c.cfg.ConnectionName + "-" + randomHex(6)
	deliveries, err := ch.Consume(c.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("starting consumer: %w", err)
	}
	log.Info("consuming", slog.String("consumer_tag", tag), slog.Int("prefetch", c.cfg.Prefetch))

	s := &loop[TTx]{c: c, ch: ch, dl: dl, log: log, wg: &wg, completions: make(chan completion, c.cfg.Workers)}
	// Batches run on a context of their own so that a shutdown lets them
	// reach their commit; ShutdownGrace later they are cancelled.
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	s.bctx = bctx
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownGrace, cancel) })
	defer stopGrace()
	return true, s.run(ctx, tag, deliveries, connClosed, chClosed)
}

// loop is the single goroutine that owns a session's channel and tracker:
// every frame to the broker about a delivery is sent from here.
type loop[TTx any] struct {
	c           *Consumer[TTx]
	ch          *amqp.Channel
	dl          *deadLetterer
	log         *slog.Logger
	wg          *sync.WaitGroup
	bctx        context.Context
	completions chan completion

	tr          tracker
	inflight    int // batches in workers
	reruns      int // of them, batches of held deliveries
	retryStreak int
	stopping    bool
	// held gathers the deliveries whose Retry was not their fault (marked
	// Blameless: the database down, a shutdown). They stay unacked and are
	// processed again at heldAt; until they are settled no new batch starts.
	held   pending
	heldAt time.Time
}

func (s *loop[TTx]) run(ctx context.Context, tag string, deliveries <-chan amqp.Delivery, connClosed, chClosed <-chan *amqp.Error) error {
	cfg := &s.c.cfg
	var (
		batch      pending
		batchTimer = time.NewTimer(time.Hour)
		timerOn    bool
		timedOut   bool
		requeue    = time.NewTimer(time.Hour)
		done       = ctx.Done()
	)
	batchTimer.Stop()
	requeue.Stop()
	defer batchTimer.Stop()
	defer requeue.Stop()
	for {
		in := deliveries
		if len(batch.msgs) >= cfg.BatchSize || s.stopping {
			in = nil
		}
		select {
		case d, ok := <-in:
			if !ok {
				return errors.New("delivery channel closed (consumer cancelled by the broker?)")
			}
			s.tr.add(d.DeliveryTag)
			s.c.stats.delivered.Add(1)
			if d.Redelivered {
				s.c.stats.redelivered.Add(1)
				cfg.Hooks.Redelivered(cfg.Queue)
			}
			batch.deliveries = append(batch.deliveries, d)
			batch.msgs = append(batch.msgs, Message(&d, cfg.Queue, cfg.IDHeader))
			if !timerOn {
				batchTimer.Reset(cfg.BatchWait)
				timerOn, timedOut = true, false
			}
		case <-batchTimer.C:
			timedOut = true
		case r := <-s.completions:
			s.inflight--
			if r.batch.rerun {
				s.reruns--
			}
			if r.err != nil {
				return r.err
			}
			if err := s.settle(r); err != nil {
				return err
			}
		case <-requeue.C:
			if err := s.send(s.tr.due(time.Now())); err != nil {
				return err
			}
		case e, ok := <-connClosed:
			return closedError("connection", e, ok)
		case e, ok := <-chClosed:
			return closedError("channel", e, ok)
		case <-done:
			done = nil
			s.stopping = true
			// Stop the flow first; deliveries not yet in a batch are never
			// processed and return to the queue when the channel closes.
			if err := s.ch.Cancel(tag, false); err != nil {
				return fmt.Errorf("cancelling consumer: %w", err)
			}
			if err := s.send(s.tr.due(time.Now().Add(24 * time.Hour))); err != nil {
				return err
			}
		}
		if s.stopping {
			if s.inflight == 0 {
				return nil
			}
			continue
		}
		if len(s.held.msgs) > 0 && s.inflight < cfg.Workers && !time.Now().Before(s.heldAt) {
			s.rerun()
		}
		// Intake pauses while a requeue waits or a held delivery is not
		// settled yet: the database is probably down.
		paused := s.tr.nWaiting > 0 || len(s.held.msgs) > 0 || s.reruns > 0
		if n := len(batch.msgs); n > 0 && (n >= cfg.BatchSize || timedOut) && s.inflight < cfg.Workers && !paused {
			s.dispatch(batch)
			batch = pending{}
			batchTimer.Stop()
			timerOn, timedOut = false, false
		}
		next, ok := s.tr.nextDue()
		if len(s.held.msgs) > 0 && (!ok || s.heldAt.Before(next)) {
			next, ok = s.heldAt, true
		}
		if ok {
			requeue.Reset(time.Until(next))
		}
	}
}

func closedError(what string, e *amqp.Error, ok bool) error {
	if !ok || e == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s closed: %w", what, e)
}

// rerun dispatches the held deliveries again.
func (s *loop[TTx]) rerun() {
	b := s.held
	s.held = pending{}
	b.rerun = true
	tags := make([]uint64, len(b.deliveries))
	for i := range b.deliveries {
		tags[i] = b.deliveries[i].DeliveryTag
	}
	s.tr.process(tags)
	s.reruns++
	s.dispatch(b)
}

// dispatch hands a batch to a worker goroutine.
func (s *loop[TTx]) dispatch(b pending) {
	s.inflight++
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.completions <- s.work(b)
	}()
}

// work processes a batch and prepares its settlement. It runs off the loop,
// so it must not touch the tracker or send frames on the consuming channel.
func (s *loop[TTx]) work(b pending) completion {
	cfg := &s.c.cfg
	results := s.c.proc.ProcessBatch(s.bctx, b.msgs)
	r := completion{batch: b, decisions: make([]decision, len(results))}
	for i, res := range results {
		r.decisions[i] = s.c.decide(s.bctx, res)
		if d := r.decisions[i]; d.res.Outcome != res.Outcome {
			s.log.Warn("dead-lettering a message that keeps ending in retry",
				slog.String("message_id", res.MessageID), slog.Any("error", d.res.Err))
		}
	}
	if cfg.Faults != nil {
		if err := cfg.Faults(s.bctx, BeforeSettle, b.msgs); err != nil {
			r.err = fmt.Errorf("withholding settlement (fault at %s): %w", BeforeSettle, err)
			return r
		}
	}
	if s.dl != nil {
		if err := s.dl.republish(s.bctx, b.deliveries, r.decisions); err != nil {
			s.log.Error("republishing dead letters failed; they will be requeued", slog.Any("error", err))
			if s.dl.ch.IsClosed() {
				// The broker closed the publishing channel (a missing
				// exchange answers 404 that way); a new session reopens it.
				r.err = fmt.Errorf("republishing dead letters: %w", err)
			}
		}
	}
	return r
}

// settle turns a completion into frames.
func (s *loop[TTx]) settle(r completion) error {
	retry, applied, holding := false, false, 0
	for _, d := range r.decisions {
		retry = retry || d.frame == Requeue || d.frame == hold
		applied = applied || d.res.Outcome == idem.Applied
		if d.frame == hold {
			holding++
		}
	}
	at := time.Now()
	switch {
	case s.stopping:
		// Shutting down: nothing waits; requeue at once.
	case retry:
		s.retryStreak++
		at = at.Add(s.c.requeueBackoff.Backoff(s.retryStreak))
	case applied:
		s.retryStreak = 0
	}
	tags := make([]uint64, len(r.batch.deliveries))
	for i := range r.batch.deliveries {
		tags[i] = r.batch.deliveries[i].DeliveryTag
	}
	ops := s.tr.finish(tags, r.decisions, at)
	if s.stopping {
		// Held deliveries are left unacked: closing the channel returns
		// them to the queue.
		ops = append(ops, s.tr.due(at)...)
	} else if holding > 0 {
		for i, d := range r.decisions {
			if d.frame == hold {
				s.held.deliveries = append(s.held.deliveries, r.batch.deliveries[i])
				s.held.msgs = append(s.held.msgs, r.batch.msgs[i])
			}
		}
		s.heldAt = at
		first := r.decisions[slices.IndexFunc(r.decisions, func(d decision) bool { return d.frame == hold })]
		s.log.Warn("holding deliveries whose retry is not their fault; processing them again after a backoff",
			slog.Int("held", len(s.held.msgs)), slog.Duration("backoff", time.Until(at).Round(time.Millisecond)), slog.Any("error", first.res.Err))
	}
	return s.send(ops)
}

// send writes frames to the broker, then counts and reports them.
func (s *loop[TTx]) send(ops []op) error {
	cfg := &s.c.cfg
	st := &s.c.stats
	for _, o := range ops {
		var err error
		switch o.verb {
		case Ack:
			err = s.ch.Ack(o.tag, o.multiple)
		case Requeue:
			err = s.ch.Nack(o.tag, false, true)
		case DeadLetter:
			err = s.ch.Reject(o.tag, false)
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
			cfg.Hooks.Settled(cfg.Queue, d.verb, d.res)
			if d.report && d.verb == DeadLetter {
				s.c.proc.Report(d.res)
			}
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}
