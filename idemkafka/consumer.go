package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Consumer reads records from a Kafka consumer group and applies each once in
// effect through an idem.Processor: it commits a partition's offset only
// after the records up to it committed in the database, keeps the order of
// each partition and retries or dead-letters a failing record without
// holding up the other partitions.
type Consumer[TTx any] struct {
	cl   *kgo.Client
	dlq  *kgo.Client
	proc *idem.Processor[TTx]
	cfg  Config
	// kit keeps health and calls the hooks: the processor's, then the
	// consumer's own.
	kit   *idembroker.Settler
	hooks []idem.Hook // kit's, for this package's own hooks
	owned bool        // New built cl: Run closes it
	// backoff paces the tries to produce a dead letter.
	backoff  idem.Backoff
	settler  settler
	dlTopics deadLetterTopics
	stats    counters

	running atomic.Bool
	health  *idembroker.HealthState
	lag     lagTracker
	marks   commitMarks
	pending pendingCommits
	// vouching compares the database's positions with the broker's
	// (Config.Positions).
	vouching vouching
	// pollFailed is set after a poll that brought only errors, and
	// cleared by one the broker served.
	pollFailed atomic.Bool

	crashOnce sync.Once
	crashed   chan struct{}
	crashErr  error // set before crashed is closed
}

// NewConsumer returns a consumer over a client the caller built (with its
// TLS, SASL and timeouts). The client must consume in a group with
// auto-commit disabled and rebalances blocked on poll; append
// [GroupOptions] to its options. NewConsumer refuses any other client with
// an error wrapping [ErrClientUnsafe]. The caller closes the client after
// Run returns.
func NewConsumer[TTx any](cl *kgo.Client, proc *idem.Processor[TTx], cfg *Config) (*Consumer[TTx], error) {
	if err := checkClient(cl); err != nil {
		return nil, err
	}
	if proc == nil {
		return nil, fmt.Errorf("%w: processor is nil", ErrConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	rebalance := rebalanceTimeout(cl)
	c.setDefaults(rebalance)
	if err := c.validate(rebalance); err != nil {
		return nil, err
	}
	dlq := c.DeadLetterClient
	if dlq == nil {
		dlq = cl
	}
	if err := checkDeadLetterClient(dlq); err != nil {
		return nil, err
	}
	// The settler logs the end of an outage's hold.
	kit := idembroker.NewSettler(proc.Consumer(), topicsOf(cl), append(slices.Clip(proc.Hooks()), c.Hooks...), c.Logger)
	cons := &Consumer[TTx]{
		cl: cl, dlq: dlq, proc: proc, cfg: c, kit: kit, hooks: kit.Hooks(),
		backoff: c.Backoff,
		crashed: make(chan struct{}),
		health:  kit.Health(),
	}
	cons.vouching.checked = map[tp]int32{}
	cons.vouching.refused = map[tp]refusal{}
	cons.dlTopics = deadLetterTopics{cl: dlq, name: c.DeadLetterTopic, create: c.CreateDeadLetterTopics, known: map[string]bool{}}
	cons.settler = settler{
		deadLetter: cons.deadLetter,
		minDelay:   c.Backoff.Initial, stats: &cons.stats,
	}
	return cons, nil
}

// New builds a client from cc and returns a consumer that owns it: Run
// closes the client when it returns.
func New[TTx any](cc ClientConfig, proc *idem.Processor[TTx], cfg *Config) (*Consumer[TTx], error) {
	var errs []error
	if len(cc.Brokers) == 0 {
		errs = append(errs, errors.New("no brokers"))
	}
	if cc.Group == "" {
		errs = append(errs, errors.New("no consumer group"))
	}
	if len(cc.Topics) == 0 {
		errs = append(errs, errors.New("no topics"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(cc.Brokers...)}, cc.Options...)
	cl, err := kgo.NewClient(append(opts, GroupOptions(cc.Group, cc.Topics...)...)...)
	if err != nil {
		return nil, fmt.Errorf("creating kafka client: %w", err)
	}
	c, err := NewConsumer(cl, proc, cfg)
	if err != nil {
		cl.Close()
		return nil, err
	}
	c.owned = true
	return c, nil
}

// Client returns the consuming client.
func (c *Consumer[TTx]) Client() *kgo.Client { return c.cl }

// Crash stops the consumer as if its process died right after its last
// database commit: no further offset is committed and the client is closed,
// so the group hands the partitions to another member, which gets every
// record whose offset was not committed again. It is for tests and drills
// (the crash-after-commit demo), never for production shutdown: cancel Run's
// context for that. Run returns an error wrapping [ErrCrashed].
func (c *Consumer[TTx]) Crash() { c.crash(errors.New("crash requested")) }

func (c *Consumer[TTx]) crash(cause error) {
	c.crashOnce.Do(func() {
		c.crashErr = fmt.Errorf("%w: %w", ErrCrashed, cause)
		close(c.crashed)
	})
}

func (c *Consumer[TTx]) crashing() bool {
	select {
	case <-c.crashed:
		return true
	default:
		return false
	}
}

// Run consumes until ctx is cancelled, then finishes or abandons the batches
// in flight (an abandoned record is redelivered and deduplicated), commits
// what committed in the database, leaves the group and returns nil. It
// returns an error when the client was closed under it or the consumer
// crashed. Run may be called once.
//
// Before it takes a record, Run checks that the inbox can be used
// (idem.Processor.Check: an error wraps idem.ErrInboxNotReady) and that
// the dead-letter topic of every consumed topic exists (an error wraps
// [ErrDeadLetterTopic]); it refuses to start otherwise, and leaves the
// group. An inbox database that does not answer within CommitTimeout is
// an outage, not a reason to refuse: Run starts and holds the records
// until it answers.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("idemkafka: Run called twice")
	}
	c.health.Start(time.Now())
	defer func() { c.health.Stop(time.Now()) }()
	if err := c.start(ctx); err != nil {
		// The client joined the group when it was built: leave it, or
		// the partitions assigned to this member would wait for a poll
		// that never comes.
		if c.owned {
			c.cl.Close()
		} else {
			c.cl.LeaveGroup()
		}
		return err
	}
	if c.health.Health().Holding {
		defer c.recheck(ctx)()
	}
	sig := &rebalanceSignal{count: func() {
		c.stats.rebalances.Add(1)
		c.lag.reset()
	}}
	waiting.Store(c.cl, sig)
	defer waiting.Delete(c.cl)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.crashed:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		// Armed before the poll: a rebalance waits for the round from the
		// moment the poll returned.
		rebalance := sig.arm()
		fetches := c.poll(ctx)
		closed := fetches.IsClientClosed()
		if c.cfg.Positions != PositionsOff && !closed && ctx.Err() == nil {
			fetches = c.vouch(ctx, fetches)
		}
		rd := newRound(ctx, c.cl, c.runPartition, c.cfg.MaxPollRecords, c.cfg.RebalanceGrace, rebalance, c.cfg.Logger, &c.stats)
		rd.observe = c.observePoll
		rd.run(fetches)
		if !closed && !c.crashing() && !isClosed(rebalance) {
			// Still within the round: the partitions are this member's.
			c.resendPending(ctx, ctx.Err() != nil)
		}
		sig.disarm()
		// Every batch of this poll is settled and committed, or given up
		// with its partition rewound: only now may a rebalance revoke its
		// partitions.
		c.cl.AllowRebalance()
		switch {
		case c.crashing():
			c.cl.Close()
			return c.crashErr
		case closed:
			return fmt.Errorf("consuming: %w", kgo.ErrClientClosed)
		case ctx.Err() != nil:
			if c.owned {
				c.cl.Close() // leaves the group
			} else {
				c.cl.LeaveGroup()
			}
			return nil
		case fetches.NumRecords() == 0 && len(fetches.Errors()) > 0:
			// A broker that keeps failing (authorization, an unknown topic)
			// answers at once; do not spin on it.
			_ = sleep(ctx, c.cfg.Backoff.Initial)
		}
	}
}

// poll polls the client. While a commit is pending (see
// [pendingCommits]) the poll ends when its re-send is due, records or not:
// that poll returns no fetch at all, so that neither the health nor the
// error backoff takes the consumer's own timeout for a broker's error.
// The client holds rebalances after such a poll as after any other.
func (c *Consumer[TTx]) poll(ctx context.Context) kgo.Fetches {
	due, ok := c.pending.due()
	if c.cfg.Positions != PositionsOff {
		// A partition assigned is compared with the database's position
		// even when it brings no record (a consumer at the end of a log
		// whose database lost its last effects), and a refused one is
		// checked again: the poll ends in time for it, records or not.
		if wake := c.vouching.wake(c.cl, c.cfg.Backoff); !ok || wake.Before(due) {
			due, ok = wake, true
		}
	}
	if !ok {
		return c.cl.PollRecords(ctx, c.cfg.MaxPollRecords)
	}
	pctx, cancel := context.WithDeadline(ctx, due)
	defer cancel()
	f := c.cl.PollRecords(pctx, c.cfg.MaxPollRecords)
	if ctx.Err() == nil && pctx.Err() != nil && ownTimeout(f) {
		return nil
	}
	return f
}

// ownTimeout reports whether f is what a poll whose context expired
// returns: one error, the context's, of no partition.
func ownTimeout(f kgo.Fetches) bool {
	errs := f.Errors()
	return f.NumRecords() == 0 && len(errs) == 1 && errs[0].Topic == "" && errors.Is(errs[0].Err, context.DeadlineExceeded)
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool { return closed(ch) }

// start makes the checks Run makes before it takes a record. An inbox
// database that does not answer is an outage, not a misconfiguration: the
// consumer starts and holds its records until the database answers, as it
// would for an outage met later (refusing would leave its partitions with
// a member that never polls, or a process in a restart loop).
func (c *Consumer[TTx]) start(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	err := c.proc.Check(cctx)
	timedOut := cctx.Err() != nil
	cancel()
	switch {
	case err == nil:
		c.health.Reachable(time.Now())
	case ctx.Err() != nil:
		return fmt.Errorf("idemkafka: not starting: %w", ctx.Err())
	case errors.Is(err, idem.ErrUnavailable), timedOut:
		if !errors.Is(err, idem.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
		}
		c.health.Unreachable(err, time.Now())
		c.cfg.Logger.Warn("inbox database unreachable at start; consuming, records are held until it answers",
			"consumer", c.proc.Consumer(), "error", err)
	default:
		return fmt.Errorf("idemkafka: not starting: %w", err)
	}
	if c.cfg.Positions != PositionsOff && err == nil {
		// The database answered: a table it cannot read positions from
		// was migrated by an older build.
		pctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
		_, perr := c.proc.Positions(pctx)
		cancel()
		if perr != nil && ctx.Err() == nil {
			return fmt.Errorf("idemkafka: not starting: %w: Config.Positions is %s, and the database's positions cannot be read (run `idem migrate` to create the positions table): %w", ErrConfig, c.cfg.Positions, perr)
		}
	}
	topics, _ := c.cl.OptValue(kgo.ConsumeTopics).([]string)
	if regex, _ := c.cl.OptValue(kgo.ConsumeRegex).(bool); regex {
		// Patterns, not names: each dead-letter topic is checked before
		// its first dead letter instead.
		topics = nil
	}
	for _, t := range topics {
		if err := c.dlTopics.ensure(ctx, t); err != nil {
			return fmt.Errorf("idemkafka: not starting: %w", err)
		}
	}
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
