package idemnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// Consumer consumes one JetStream stream, through a durable pull
// consumer, into an [idem.Processor]: it fetches a batch, processes it in
// one ProcessBatch, and acks a message only after the transaction that
// applied it committed; it keeps the messages it works on alive with
// InProgress heartbeats, holds them through an outage of the inbox
// database, and terminates one only once its dead letter is durable in a
// dead-letter stream it checked at start. Create it with [NewConsumer] and
// start it with [Consumer.Run].
//
// Order: one Consumer fetches in stream order and processes one batch at
// a time, holding a message in place (not Nak'ing it) while the database
// is away, so a stream (and each subject) is applied in order. Two
// consumers of one durable share its messages, in no order. A message
// Nak'd because its commit's outcome was unknown comes back after its
// delay, behind the messages fetched meanwhile: JetStream counts a Nak'd
// message as pending until it is delivered again, so the durable's
// MaxAckPending bounds how many go ahead of it (MaxAckPending - 1), and a
// durable with MaxAckPending 1 (BatchSize 1) keeps strict order even
// then, at one message per round trip.
type Consumer[TTx any] struct {
	proc *idem.Processor[TTx]
	cfg  Config
	// settler keeps health and calls the hooks: the processor's, then the
	// consumer's own.
	settler *idembroker.Settler
	health  *idembroker.HealthState

	running atomic.Bool
	dialer  dialer
	// hb is the heartbeat interval for the durable's AckWait, set at start.
	hb time.Duration

	stats struct {
		delivered, redelivered, applied, duplicates, naked, held, deadLettered, heartbeats, reconnects atomic.Uint64
	}
	inFlight atomic.Int64
}

// Stats counts what a consumer did since it was created.
type Stats struct {
	// Delivered counts messages fetched; Redelivered those JetStream
	// delivered before.
	Delivered, Redelivered uint64
	// Applied and Duplicates count acked messages by outcome.
	Applied, Duplicates uint64
	// Naked counts NakWithDelay sent; DeadLettered counts dead letters
	// durable in the dead-letter stream (and their originals terminated).
	Naked, DeadLettered uint64
	// Held counts messages kept to be processed again, once per time
	// they were held.
	Held uint64
	// Heartbeats counts InProgress sent.
	Heartbeats uint64
	// Reconnects counts connections re-established.
	Reconnects uint64
}

// ErrRunning is returned by [Consumer.Run] when the consumer already runs.
var ErrRunning = errors.New("idemnats: consumer is already running")

// NewConsumer returns a consumer of cfg.Stream into proc. It applies
// cfg's defaults and returns an error wrapping [ErrConfig] when cfg is
// invalid. It does not connect; [Consumer.Run] does.
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
	settler := idembroker.NewSettler(proc.Consumer(), c.Stream, append(slices.Clip(proc.Hooks()), c.Hooks...), c.Logger.With(slog.String("stream", c.Stream)))
	return &Consumer[TTx]{proc: proc, cfg: c, settler: settler, health: settler.Health()}, nil
}

// Stats returns the consumer's counters.
func (c *Consumer[TTx]) Stats() Stats {
	s := &c.stats
	return Stats{
		Delivered: s.delivered.Load(), Redelivered: s.redelivered.Load(),
		Applied: s.applied.Load(), Duplicates: s.duplicates.Load(),
		Naked: s.naked.Load(), DeadLettered: s.deadLettered.Load(),
		Held: s.held.Load(), Heartbeats: s.heartbeats.Load(), Reconnects: s.reconnects.Load(),
	}
}

// Health reports the consumer's state for probes and status pages
// ([idembroker.HandleHealth]): whether Run runs, whether its connection is up,
// whether it holds messages because the inbox database is unreachable
// (since when and why), when a message was last settled, the last error,
// the reconnects so far and the messages fetched and not yet settled (at
// most BatchSize). It asks neither the server nor the database.
func (c *Consumer[TTx]) Health() idembroker.Health {
	h := c.health.Health()
	h.Reconnects = c.stats.reconnects.Load()
	h.InFlight = int(c.inFlight.Load())
	return h
}

// DropConnection cuts the consumer's connection at the socket, as a
// network failure would: the client reconnects by itself, and what it
// did not ack is redelivered after AckWait. It is meant for tests and
// drills, and reports whether a connection was open.
func (c *Consumer[TTx]) DropConnection() bool { return c.dialer.cut() }

// Run consumes until ctx is cancelled, then shuts down gracefully: it
// fetches nothing more, the batch in flight finishes (or, after
// [Config.ShutdownGrace], rolls back), what committed is acked and
// flushed to the server, held messages are Nak'd, and Run returns nil.
//
// Before it fetches, Run checks the inbox ([idem.Processor.Check]), the
// stream, the durable (creating it when missing) and the dead-letter
// stream, and returns an error when one is not fit: wrapping
// [idem.ErrInboxNotReady] for an inbox table that is missing,
// [ErrConfig] for a durable that would discard messages or redeliver
// them while they are processed, [ErrNoDeadLetterDestination] when dead
// letters would have nowhere to go, [jetstream.ErrStreamNotFound] for a
// missing stream. An inbox database or a server that is only unreachable
// is waited for, with backoff.
//
// What becomes of each message is the processor's decision
// ([idem.Result.Disposition]), mapped to JetStream verbs by [VerbFor].
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)
	c.health.Start(time.Now())
	defer func() { c.health.Stop(time.Now()) }()
	log := c.cfg.Logger.With(slog.String("consumer", c.proc.Consumer()), slog.String("stream", c.cfg.Stream))
	if err := c.checkInbox(ctx, log); err != nil || ctx.Err() != nil {
		return err
	}
	nc, err := c.connect(log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("idemnats: %w", err)
	}
	cons, err := c.start(ctx, js, log)
	if err != nil || ctx.Err() != nil {
		return err
	}
	log.Info("consuming", slog.String("durable", c.cfg.Durable), slog.Duration("heartbeat", c.hb),
		slog.String("dead_letter_stream", c.cfg.DeadLetterStream))

	// Batches run on a context of their own, so that a shutdown lets the
	// batch in flight reach its commit; ShutdownGrace later it is
	// cancelled.
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownGrace, cancel) })
	defer stopGrace()

	failures := 0
	for ctx.Err() == nil {
		msgs, err := c.fetch(ctx, cons)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			c.health.Fail(fmt.Errorf("fetching: %w", err), time.Now())
			wait := c.cfg.Backoff.Delay(failures)
			log.Warn("fetch failed; fetching again", slog.Any("error", err), slog.Duration("backoff", wait))
			_ = sleep(ctx, wait)
			continue
		}
		failures = 0
		if len(msgs) == 0 {
			continue
		}
		if err := c.handle(ctx, bctx, js, msgs, log); err != nil {
			return err
		}
	}
	// The acks are sent before the connection closes.
	if err := nc.FlushTimeout(c.cfg.ShutdownGrace); err != nil {
		log.Warn("flushing acks at shutdown failed; the messages not acked come back after AckWait, as Duplicates", slog.Any("error", err))
	}
	return nil
}

// checkInbox runs the processor's inbox check until it passes, ctx ends
// (nil), or it fails for a reason waiting cannot fix (the error).
func (c *Consumer[TTx]) checkInbox(ctx context.Context, log *slog.Logger) error {
	for try := 1; ; try++ {
		err := c.proc.Check(ctx)
		switch {
		case err == nil:
			c.health.Reachable(time.Now())
			return nil
		case ctx.Err() != nil:
			return nil
		case !errors.Is(err, idem.ErrUnavailable):
			return fmt.Errorf("idemnats: consuming stream %s: %w", c.cfg.Stream, err)
		}
		c.health.Unreachable(err, time.Now())
		wait := c.cfg.Backoff.Delay(try)
		log.Warn("inbox database unreachable at start; checking again", slog.Any("error", err), slog.Duration("backoff", wait))
		if sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// connect opens the consumer's connection, which reconnects for ever and
// reports its state to the health.
func (c *Consumer[TTx]) connect(log *slog.Logger) (*nats.Conn, error) {
	h := c.health
	opts := append(append([]nats.Option(nil), c.cfg.Options...),
		nats.Name("idem-"+c.proc.Consumer()),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(c.cfg.Backoff.Initial),
		nats.SetCustomDialer(&c.dialer),
		nats.ConnectHandler(func(*nats.Conn) { h.Connect(time.Now()) }),
		nats.ReconnectHandler(func(*nats.Conn) {
			c.stats.reconnects.Add(1)
			h.Connect(time.Now())
			log.Info("reconnected")
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // Run closed it
			}
			if err == nil {
				err = errors.New("disconnected")
			}
			h.Disconnect(err, time.Now())
			c.settler.Reconnect(c.cfg.Stream, err)
			log.Warn("connection lost; reconnecting", slog.Any("error", err))
		}),
	)
	nc, err := nats.Connect(c.cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("idemnats: connecting: %w", idembroker.RedactError(err, c.cfg.URL))
	}
	if nc.IsConnected() {
		h.Connect(time.Now())
	}
	return nc, nil
}

// start checks the stream, the durable and the dead-letter stream, trying
// again while the server cannot be reached; a refusal is returned.
func (c *Consumer[TTx]) start(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (jetstream.Consumer, error) {
	for try := 1; ; try++ {
		cons, err := c.prepare(ctx, js)
		if err == nil {
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if errors.Is(err, ErrConfig) || errors.Is(err, ErrNoDeadLetterDestination) || errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("idemnats: not starting: %w", err)
		}
		wait := c.cfg.Backoff.Delay(try)
		log.Warn("JetStream not ready at start; trying again", slog.Any("error", err), slog.Duration("backoff", wait))
		if sleep(ctx, wait) != nil {
			return nil, nil
		}
	}
}

// prepare reads the stream, gets or creates the durable and checks its
// settings, and checks the dead-letter stream.
func (c *Consumer[TTx]) prepare(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	cfg := &c.cfg
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := js.Stream(rctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", cfg.Stream, err)
	}
	cons, err := js.Consumer(rctx, cfg.Stream, cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = js.CreateConsumer(rctx, cfg.Stream, jetstream.ConsumerConfig{
			Durable:        cfg.Durable,
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        cfg.AckWait,
			MaxDeliver:     -1,
			MaxAckPending:  cfg.MaxAckPending,
			FilterSubjects: cfg.FilterSubjects,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("durable %s on stream %s: %w", cfg.Durable, cfg.Stream, err)
	}
	if err := c.checkDurable(&cons.CachedInfo().Config); err != nil {
		return nil, err
	}
	if err := c.checkRetention(&st.CachedInfo().Config, ""); err != nil {
		return nil, err
	}
	if err := c.ensureDeadLetters(rctx, js, st.CachedInfo()); err != nil {
		return nil, err
	}
	c.durabilityRisks(&st.CachedInfo().Config)
	return cons, nil
}

// checkRetention refuses a stream that keeps messages longer than the
// inbox window (idem.Processor.Window, read by the inbox check), or for ever
// (MaxAge 0), naming both numbers: a replay from it could reach past the
// horizon, where markers are pruned. what says which stream it is ("" for
// the consumed one). Config.AcceptReplayPastWindow accepts it with a
// warning; a processor without a horizon guard (a window of 0 or less)
// has nothing to compare.
func (c *Consumer[TTx]) checkRetention(sc *jetstream.StreamConfig, what string) error {
	w := c.proc.Window()
	if w <= 0 || (sc.MaxAge > 0 && sc.MaxAge <= w) {
		return nil
	}
	keeps := sc.MaxAge.String()
	if sc.MaxAge <= 0 {
		keeps = "for ever (MaxAge 0)"
	}
	err := fmt.Errorf("%sstream %s keeps messages %s; the inbox window is %v: a replay from it (a durable reset, a redrive, a redelivery after a restore) could bring back a message whose marker is pruned, and apply it again; set the stream's MaxAge to at most %v, lengthen the inbox window, or set idemnats.Config.AcceptReplayPastWindow",
		what, sc.Name, keeps, w, w)
	if c.cfg.AcceptReplayPastWindow {
		c.cfg.Logger.Warn("accepted by AcceptReplayPastWindow: "+err.Error(), slog.String("consumer", c.proc.Consumer()))
		return nil
	}
	return fmt.Errorf("%w: %w", ErrConfig, err)
}

// durabilityRisks logs what of the stream's settings could lose a
// message the server acknowledged: idem's exactly-once ends where the
// stream loses what it said it stored. (A server's sync interval is its
// own configuration, unseen by clients; see docs/nats.md.)
func (c *Consumer[TTx]) durabilityRisks(sc *jetstream.StreamConfig) {
	log := c.cfg.Logger.With(slog.String("consumer", c.proc.Consumer()), slog.String("stream", sc.Name))
	if sc.Storage == jetstream.MemoryStorage {
		log.Warn("the stream is kept in memory: a server restart loses every message it holds, acknowledged or not")
	}
	if sc.Replicas < 3 {
		log.Info("the stream has fewer than 3 replicas: a lost node or disk can lose acknowledged messages", slog.Int("replicas", sc.Replicas))
	}
}

// checkDurable refuses a durable whose settings would discard a message
// or hand it to another consumer while this one processes it, naming the
// numbers; it sets the heartbeat interval for the durable's AckWait.
func (c *Consumer[TTx]) checkDurable(dc *jetstream.ConsumerConfig) error {
	var errs []error
	if dc.AckPolicy != jetstream.AckExplicitPolicy {
		errs = append(errs, fmt.Errorf("durable %s has AckPolicy %s: it must be AckExplicit, or messages count as settled before they commit", dc.Durable, dc.AckPolicy))
	}
	if dc.MaxDeliver > 0 {
		errs = append(errs, fmt.Errorf("durable %s has MaxDeliver %d: JetStream stops delivering a message after %d deliveries and puts it in no dead-letter stream, so an outage longer than %d ack waits (%v) would discard messages; set MaxDeliver -1 and let the processor's RetryPolicy dead-letter",
			dc.Durable, dc.MaxDeliver, dc.MaxDeliver, dc.MaxDeliver, time.Duration(dc.MaxDeliver)*dc.AckWait))
	}
	if dc.MaxAckPending > 0 && dc.MaxAckPending < c.cfg.BatchSize {
		errs = append(errs, fmt.Errorf("durable %s has MaxAckPending %d, less than batch size %d", dc.Durable, dc.MaxAckPending, c.cfg.BatchSize))
	}
	hb := c.cfg.heartbeat(dc.AckWait)
	if err := checkBudget(dc.AckWait, hb); err != nil {
		errs = append(errs, fmt.Errorf("durable %s: %w", dc.Durable, err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	c.hb = max(hb, time.Millisecond)
	return nil
}

// fetch returns the next batch: what the durable has for this consumer at
// once, or, when it has nothing, the first message to come within
// FetchWait and what came with it. Nothing waits in a client buffer for
// its turn: every message fetched is in the batch processed next, and
// kept alive from then on.
func (c *Consumer[TTx]) fetch(ctx context.Context, cons jetstream.Consumer) ([]jetstream.Msg, error) {
	n := c.cfg.BatchSize
	b, err := cons.FetchNoWait(n)
	msgs, err := drain(b, err)
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	fctx, cancel := context.WithTimeout(ctx, c.cfg.FetchWait)
	b, err = cons.Fetch(1, jetstream.FetchContext(fctx))
	msgs, err = drain(b, err)
	expired := fctx.Err() != nil
	cancel()
	if err != nil && expired {
		err = nil
	}
	if err != nil || len(msgs) == 0 || n == 1 {
		return msgs, err
	}
	b, err = cons.FetchNoWait(n - 1)
	more, err := drain(b, err)
	if err != nil {
		// The first message is fetched; the next fetch takes the rest.
		return msgs, nil
	}
	return append(msgs, more...), nil
}

// drain reads a fetch's messages to its end.
func drain(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for m := range b.Messages() {
		msgs = append(msgs, m)
	}
	if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return msgs, err
	}
	return msgs, nil
}

// decision is what became of one message: the processor's result, its
// disposition, and the verb the table maps it to.
type decision struct {
	verb Verb
	disp idem.Disposition
	res  idem.Result
}

// handle processes a fetched batch to its end: every message settled,
// or, at shutdown, left to the server. It returns an error only for a
// fault injected at BeforeSettle, which ends Run.
func (c *Consumer[TTx]) handle(ctx, bctx context.Context, js jetstream.JetStream, jms []jetstream.Msg, log *slog.Logger) error {
	c.inFlight.Store(int64(len(jms)))
	defer c.inFlight.Store(0)
	ims := make([]idem.Message, len(jms))
	for i, m := range jms {
		ims[i] = Message(m, c.cfg.Stream, c.cfg.IDHeader, c.cfg.TimeHeader)
		c.stats.delivered.Add(1)
		if ims[i].Redelivered {
			c.stats.redelivered.Add(1)
			c.settler.Redelivered(c.cfg.Stream)
		}
	}
	stop := c.heartbeat(jms)
	defer stop()
	todo := make([]int, len(jms))
	for i := range todo {
		todo[i] = i
	}
	for {
		batch := make([]idem.Message, len(todo))
		for j, i := range todo {
			batch[j] = ims[i]
		}
		busy := c.health.Begin(time.Now())
		results := c.proc.ProcessBatch(bctx, batch)
		c.health.End(busy, time.Now())
		if f := c.cfg.Faults; f != nil {
			if err := f(bctx, BeforeSettle, batch); err != nil {
				return fmt.Errorf("idemnats: withholding settlement (fault at %s): %w", BeforeSettle, err)
			}
		}
		var held []int
		var delay time.Duration
		for j, res := range results {
			i := todo[j]
			d := decision{disp: res.Disposition, res: res}
			d.verb = VerbFor(d.disp.Action)
			if d.verb == Hold {
				if len(held) == 0 || d.disp.Delay < delay {
					delay = d.disp.Delay
				}
				held = append(held, i)
				c.stats.held.Add(1)
				if ctx.Err() == nil {
					// Nothing is told to the server: the health
					// records the hold, and no SettleHook hears of it.
					c.health.Settle(d.disp, d.res, time.Now())
				}
				continue
			}
			c.settle(bctx, js, jms[i], d, log)
		}
		if len(held) == 0 {
			return nil
		}
		if ctx.Err() == nil {
			log.Warn("holding messages whose retry is not their fault; processing them again after a delay",
				slog.Int("held", len(held)), slog.Duration("delay", delay.Round(time.Millisecond)))
		}
		if sleep(ctx, delay) != nil {
			// Shutdown: the next consumer takes them at once.
			for _, i := range held {
				_ = jms[i].Nak()
			}
			return nil
		}
		todo = held
	}
}

// settle carries out one decision other than Hold at the server, then
// counts and reports it. A verb that could not be sent leaves the
// message to the server, which redelivers it after AckWait.
func (c *Consumer[TTx]) settle(ctx context.Context, js jetstream.JetStream, m jetstream.Msg, d decision, log *slog.Logger) {
	var err error
	switch d.verb {
	case Ack:
		if c.cfg.ConfirmAcks {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = m.DoubleAck(actx)
			cancel()
		} else {
			err = m.Ack()
		}
		if err == nil {
			if d.res.Outcome == idem.Duplicate {
				c.stats.duplicates.Add(1)
			} else {
				c.stats.applied.Add(1)
			}
		}
	case DeadLetter:
		if err = c.deadLetter(ctx, js, m, d); err == nil {
			if err = m.TermWithReason(d.disp.Reason); err == nil {
				c.stats.deadLettered.Add(1)
			}
		}
	default:
		if err = m.NakWithDelay(d.disp.Delay); err == nil {
			c.stats.naked.Add(1)
		}
	}
	if err != nil {
		log.Warn("settling a message failed; the server redelivers it after AckWait", slog.String("verb", d.verb.String()),
			slog.String("message_id", d.res.MessageID), slog.Any("error", err))
		return
	}
	c.settler.Settle(c.cfg.Stream, d.disp, d.res, time.Now())
}

// heartbeat sends InProgress for each of msgs not settled yet, every
// heartbeat interval, until stop is called.
func (c *Consumer[TTx]) heartbeat(msgs []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(c.hb)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			for _, m := range msgs {
				// A settled message refuses it in the client, sending
				// nothing.
				if m.InProgress() == nil {
					c.stats.heartbeats.Add(1)
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// dialer dials the server and remembers the socket, so that
// DropConnection can cut it.
type dialer struct {
	mu   sync.Mutex
	sock net.Conn
}

func (d *dialer) Dial(network, address string) (net.Conn, error) {
	s, err := (&net.Dialer{Timeout: 5 * time.Second}).Dial(network, address)
	if err == nil {
		d.mu.Lock()
		d.sock = s
		d.mu.Unlock()
	}
	return s, err
}

func (d *dialer) cut() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sock == nil {
		return false
	}
	_ = d.sock.Close()
	d.sock = nil
	return true
}
