package idemredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// Consumer reads a Redis stream as a member of a consumer group and
// applies each entry once in effect through an idem.Processor: it XACKs an
// entry only after its effect committed in the database, applies a
// stream's entries in order, keeps an entry pending (never dead-letters
// it) while the database is away, copies a dead letter to the dead-letter
// stream and acks it in one atomic script, and takes over the pending
// entries of consumers that died (XAUTOCLAIM).
type Consumer[TTx any] struct {
	rdb   redis.UniversalClient
	proc  *idem.Processor[TTx]
	cfg   Config
	stats counters

	// consumer is the processor's name. set keeps the health and calls
	// the hooks: the processor's, then the consumer's own; health is its
	// state.
	consumer string
	set      *idembroker.Settler
	health   *idembroker.HealthState

	running  atomic.Bool
	inFlight atomic.Int64
	// lag is the group's, as of the last claim scan.
	lag atomic.Int64

	// Where the reads stand: backlog is the ID after which this
	// consumer's own pending entries are read again (at start, under a
	// name that has some), empty once they are; claimFrom is the cursor of
	// the XAUTOCLAIM scan, nextClaim when the next scan is due.
	backlog   string
	claimFrom string
	nextClaim time.Time

	crashOnce sync.Once
	crashed   chan struct{}
	crashErr  error
}

// New returns a consumer of cfg.Stream over rdb (a *redis.Client, a
// ring or a cluster client the caller built, with its TLS and timeouts;
// the caller closes it after Run returns).
func New[TTx any](rdb redis.UniversalClient, proc *idem.Processor[TTx], cfg *Config) (*Consumer[TTx], error) {
	if rdb == nil || proc == nil {
		return nil, fmt.Errorf("%w: the client and the processor are required", ErrConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	// The settler logs the end of an outage's hold.
	set := idembroker.NewSettler(proc.Consumer(), c.Stream, append(slices.Clip(proc.Hooks()), c.Hooks...), c.Logger)
	return &Consumer[TTx]{
		rdb: rdb, proc: proc, cfg: c,
		consumer: proc.Consumer(), set: set, health: set.Health(),
		backlog: "0", claimFrom: "0-0",
		crashed: make(chan struct{}),
	}, nil
}

// Name is the consumer's name in its group.
func (c *Consumer[TTx]) Name() string { return c.cfg.Name }

// Health reports the consumer's state for probes and status pages
// ([idembroker.HandleHealth]): whether Run runs, whether its last Redis call
// succeeded, whether it holds entries because the inbox database is
// unreachable (they stay pending, never dead-lettered), when an entry was
// last settled, the last error, the entries in hand (InFlight), and the
// group's lag as of the last claim scan (TotalLag: entries added to the
// stream and not yet read by the group). It asks neither Redis nor the
// database.
func (c *Consumer[TTx]) Health() idembroker.Health {
	h := c.health.Health()
	h.InFlight = int(c.inFlight.Load())
	if lag := c.lag.Load(); lag >= 0 {
		h.TotalLag = lag
	}
	return h
}

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

// Run consumes until ctx is cancelled, then finishes or abandons the
// batch in hand (an abandoned entry stays pending, and is taken over and
// found in the inbox), acks what committed and returns nil. Run may be
// called once.
//
// Before it reads an entry, Run checks that the inbox can be used
// (idem.Processor.Check: an error wraps idem.ErrInboxNotReady), that the
// group exists ([ErrNoGroup]) and that the dead-letter stream exists and
// is a stream ([ErrDeadLetterStream]), and that the stream holds no entry
// older than the inbox window, nor keeps any that long by Config.MaxAge
// ([ErrConfig], naming both; see Config.AcceptReplayPastWindow); it
// refuses to start otherwise. An
// inbox database or a Redis that does not answer is an outage, not a
// refusal: Run waits for it. It logs the risks [Consumer.Durability]
// finds. Then it reads its own pending entries (a restart under the same
// name), the entries of idle consumers (XAUTOCLAIM, every ClaimEvery) and
// new entries (XREADGROUP), BatchSize at a time, each batch one
// ProcessBatchInOrder.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("idemredis: Run called twice")
	}
	c.health.Start(now())
	defer func() { c.health.Stop(now()) }()
	if err := c.start(ctx); err != nil {
		return err
	}
	if c.health.Health().Holding {
		defer c.recheck(ctx)()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.crashed:
			cancel()
		case <-ctx.Done():
		}
	}()
	for try := 1; ; {
		if c.crashing() {
			return c.crashErr
		}
		if ctx.Err() != nil {
			c.leave(ctx)
			return nil
		}
		entries, err := c.read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			c.health.Disconnect(err, now())
			c.cfg.Logger.Warn("reading the stream failed; trying again", "consumer", c.consumer, "stream", c.cfg.Stream, "error", err)
			_ = sleep(ctx, c.cfg.Backoff.Delay(try))
			try++
			continue
		}
		try = 1
		c.health.Connect(now())
		if len(entries) > 0 {
			c.handle(ctx, entries)
		}
	}
}

// leave removes this consumer from its group at a graceful stop, unless it
// still holds pending entries (then they stay with its name, to be taken
// over after ClaimIdle): consumer names do not pile up in XINFO CONSUMERS
// with every restart.
func (c *Consumer[TTx]) leave(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.AckTimeout)
	defer cancel()
	if err := DeleteConsumer(dctx, c.rdb, c.cfg.Stream, c.cfg.Group, c.cfg.Name); err != nil {
		c.cfg.Logger.Debug("consumer left in its group", "consumer", c.consumer, "name", c.cfg.Name, "error", err)
	}
}

// start makes the checks Run makes before it reads an entry.
func (c *Consumer[TTx]) start(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := c.proc.Check(cctx)
	timedOut := cctx.Err() != nil
	cancel()
	switch {
	case err == nil:
		c.health.Reachable(now())
	case ctx.Err() != nil:
		return fmt.Errorf("idemredis: not starting: %w", ctx.Err())
	case errors.Is(err, idem.ErrUnavailable), timedOut:
		if !errors.Is(err, idem.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
		}
		c.health.Unreachable(err, now())
		c.cfg.Logger.Warn("inbox database unreachable at start; consuming, entries are held until it answers",
			"consumer", c.consumer, "error", err)
	default:
		return fmt.Errorf("idemredis: not starting: %w", err)
	}
	for try := 1; ; try++ {
		err := c.ensureGroup(ctx)
		if err == nil {
			err = c.ensureDeadLetterStream(ctx)
		}
		if err == nil {
			err = c.checkReplay(ctx)
		}
		if err == nil {
			break
		}
		if r := (*refusal)(nil); errors.As(err, &r) {
			return fmt.Errorf("idemredis: not starting: %w", err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("idemredis: not starting: %w", ctx.Err())
		}
		c.health.Disconnect(err, now())
		c.cfg.Logger.Warn("redis unreachable at start; trying again", "consumer", c.consumer, "error", err)
		if sleep(ctx, c.cfg.Backoff.Delay(try)) != nil {
			return fmt.Errorf("idemredis: not starting: %w", ctx.Err())
		}
	}
	c.health.Connect(now())
	if d, err := c.Durability(ctx); err != nil {
		c.cfg.Logger.Warn("reading redis durability settings failed", "consumer", c.consumer, "error", err)
	} else {
		for _, r := range d.Risks {
			c.cfg.Logger.Warn("redis durability risk", "consumer", c.consumer, "stream", c.cfg.Stream, "risk", r.What, "fix", r.Fix)
		}
	}
	return nil
}

// read returns the next entries to process: this consumer's own pending
// entries first (once, at start), then the idle entries of the group when
// a claim scan is due, else new entries, waiting up to Block (and no
// longer than the next claim scan) for them.
func (c *Consumer[TTx]) read(ctx context.Context) ([]Entry, error) {
	if c.backlog != "" {
		res, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: c.cfg.Group, Consumer: c.cfg.Name, Streams: []string{c.cfg.Stream, c.backlog},
			Count: int64(c.cfg.BatchSize), Block: -1,
		}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("reading own pending entries: %w", err)
		}
		var msgs []redis.XMessage
		if len(res) > 0 {
			msgs = res[0].Messages
		}
		if len(msgs) == 0 {
			c.backlog = ""
			return nil, nil
		}
		c.backlog = msgs[len(msgs)-1].ID
		return c.withCounts(ctx, msgs)
	}
	if !time.Now().Before(c.nextClaim) {
		msgs, next, deleted, err := c.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
			Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Name,
			MinIdle: c.cfg.ClaimIdle, Start: c.claimFrom, Count: int64(c.cfg.BatchSize),
		}).Result()
		if err != nil {
			return nil, fmt.Errorf("claiming idle entries: %w", err)
		}
		c.claimFrom = next
		if next == "0-0" || next == "" {
			c.claimFrom, c.nextClaim = "0-0", time.Now().Add(c.cfg.ClaimEvery)
			c.observeLag(ctx)
		}
		if len(msgs) > 0 || len(deleted) > 0 {
			c.claimed(c.cfg.Stream, idsOf(msgs), deleted)
		}
		if len(deleted) > 0 {
			c.stats.trimmed.Add(uint64(len(deleted)))
			err := fmt.Errorf("%d pending entries of %s were deleted or trimmed from the stream before they were acked (%v): they are lost", len(deleted), c.cfg.Stream, deleted)
			c.health.Fail(err, now())
			c.cfg.Logger.Error("pending entries deleted from the stream before they were processed", "consumer", c.consumer, "stream", c.cfg.Stream, "ids", deleted)
		}
		if len(msgs) > 0 {
			c.stats.claimed.Add(uint64(len(msgs)))
			c.cfg.Logger.Info("took over idle entries", "consumer", c.consumer, "stream", c.cfg.Stream, "entries", len(msgs), "first", msgs[0].ID)
			return c.withCounts(ctx, msgs)
		}
		if c.claimFrom != "0-0" {
			return nil, nil // the scan goes on
		}
	}
	block := min(c.cfg.Block, max(time.Until(c.nextClaim), time.Millisecond))
	res, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.cfg.Group, Consumer: c.cfg.Name, Streams: []string{c.cfg.Stream, ">"},
		Count: int64(c.cfg.BatchSize), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading new entries: %w", err)
	}
	var out []Entry
	for _, s := range res {
		for _, m := range s.Messages {
			out = append(out, entryOf(c.cfg.Stream, m, 1))
		}
	}
	return out, nil
}

// withCounts makes entries of msgs, read again or claimed, with their
// delivery counters (XPENDING of this consumer over their range).
func (c *Consumer[TTx]) withCounts(ctx context.Context, msgs []redis.XMessage) ([]Entry, error) {
	pend, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Name,
		Start: msgs[0].ID, End: msgs[len(msgs)-1].ID, Count: int64(len(msgs)) + 1,
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("reading delivery counters: %w", err)
	}
	counts := make(map[string]int64, len(pend))
	for _, p := range pend {
		counts[p.ID] = p.RetryCount
	}
	out := make([]Entry, 0, len(msgs))
	var gone []string
	for _, m := range msgs {
		if m.Values == nil {
			// Read again from the pending list after its data was
			// deleted or trimmed: nothing to apply, ever.
			gone = append(gone, m.ID)
			continue
		}
		out = append(out, entryOf(c.cfg.Stream, m, counts[m.ID]))
	}
	if len(gone) > 0 {
		c.stats.trimmed.Add(uint64(len(gone)))
		c.health.Fail(fmt.Errorf("%d pending entries of %s were deleted or trimmed before they were acked: they are lost", len(gone), c.cfg.Stream), now())
		c.cfg.Logger.Error("pending entries deleted from the stream before they were processed; acking them", "consumer", c.consumer, "stream", c.cfg.Stream, "ids", gone)
		c.ack(ctx, gone)
	}
	return out, nil
}

// observeLag records the group's lag (XINFO GROUPS: entries added and not
// yet read by the group; -1 when Redis cannot tell), for Health; at every
// claim scan.
func (c *Consumer[TTx]) observeLag(ctx context.Context) {
	groups, err := c.rdb.XInfoGroups(ctx, c.cfg.Stream).Result()
	if err != nil {
		return
	}
	for _, g := range groups {
		if g.Name == c.cfg.Group {
			c.lag.Store(g.Lag)
		}
	}
}

func idsOf(msgs []redis.XMessage) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

func now() time.Time { return time.Now() }

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

// recheck runs the inbox check again, with backoff, while the hold that
// an unreachable database at start began lasts (only an applied entry
// ends a hold otherwise, and an idle stream has none).
func (c *Consumer[TTx]) recheck(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for try := 1; c.health.Health().Holding; try++ {
			if sleep(ctx, c.cfg.Backoff.Delay(try)) != nil {
				return
			}
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.proc.Check(cctx)
			ccancel()
			if err == nil {
				c.health.Reachable(now())
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
