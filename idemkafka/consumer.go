package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Consumer reads records from a Kafka consumer group and applies each once in
// effect through an idem.Processor: it commits a partition's offset only
// after the records up to it committed in the database, keeps the order of
// each partition and retries or dead-letters a failing record without
// holding up the other partitions.
type Consumer[TTx any] struct {
	cl    *kgo.Client
	dlq   *kgo.Client
	proc  *idem.Processor[TTx]
	cfg   Config
	owned bool // New built cl: Run closes it
	// backoff paces the tries in place of a record and of a dead letter:
	// the core's policy within this consumer's bounds.
	backoff idem.RetryPolicy

	running atomic.Bool

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
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	dlq := c.DeadLetterClient
	if dlq == nil {
		dlq = cl
	}
	return &Consumer[TTx]{
		cl: cl, dlq: dlq, proc: proc, cfg: c,
		backoff: idem.RetryPolicy{InitialBackoff: c.InitialBackoff, MaxBackoff: c.MaxBackoff},
		crashed: make(chan struct{}),
	}, nil
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
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("idemkafka: Run called twice")
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
	for {
		fetches := c.cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		closed := fetches.IsClientClosed()
		c.drain(ctx, fetches)
		// Every batch of this poll is settled and committed (or abandoned):
		// only now may a rebalance revoke its partitions.
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
			_ = sleep(ctx, c.cfg.InitialBackoff)
		}
	}
}

// tp is a topic partition.
type tp struct {
	topic     string
	partition int32
}

// partWork is the records of one partition waiting for, or in, a worker.
type partWork struct {
	queue   []*kgo.Record
	running bool
	paused  bool
}

// drain processes the records of one poll, each partition in its own
// goroutine and in order, and returns when all are settled. While a
// partition backs off before a retry it is paused and drain keeps polling,
// so the other partitions flow; the rebalance stays blocked until drain
// returns. The retry budget bounds that for a poison record; a database
// outage holds it until the database is back or ctx ends.
func (c *Consumer[TTx]) drain(ctx context.Context, fetches kgo.Fetches) {
	work := make(map[tp]*partWork)
	done := make(chan tp)
	stalled := make(chan tp)
	polled := make(chan kgo.Fetches)
	running, stalls := 0, 0
	var stopPoll context.CancelFunc

	add := func(f kgo.Fetches) {
		f.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
				c.cfg.Logger.Warn("fetch error", "source", source(topic, partition), "error", err)
			}
		})
		f.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			k := tp{p.Topic, p.Partition}
			w := work[k]
			if w == nil {
				w = &partWork{}
				work[k] = w
			}
			w.queue = append(w.queue, p.Records...)
		})
	}
	launch := func() {
		for k, w := range work {
			if w.running || len(w.queue) == 0 {
				continue
			}
			recs := w.queue
			w.queue, w.running = nil, true
			running++
			go func() {
				c.runPartition(ctx, k, recs, stalled)
				done <- k
			}()
		}
	}

	add(fetches)
	launch()
	for running > 0 || stopPoll != nil {
		switch {
		case stopPoll == nil && stalls > 0 && ctx.Err() == nil:
			pctx, cancel := context.WithCancel(ctx)
			stopPoll = cancel
			go func() { polled <- c.cl.PollRecords(pctx, c.cfg.MaxPollRecords) }()
		case stopPoll != nil && (running == 0 || stalls == 0):
			// Nothing is backing off any more: end the extra poll; what it
			// returns meanwhile is still processed below.
			stopPoll()
		}
		select {
		case k := <-done:
			running--
			w := work[k]
			w.running = false
			if w.paused {
				w.paused = false
				stalls--
				c.cl.ResumeFetchPartitions(map[string][]int32{k.topic: {k.partition}})
			}
			if ctx.Err() == nil {
				launch()
			}
		case k := <-stalled:
			if w := work[k]; !w.paused {
				w.paused = true
				stalls++
				c.cl.PauseFetchPartitions(map[string][]int32{k.topic: {k.partition}})
			}
		case f := <-polled:
			stopPoll()
			stopPoll = nil
			add(f)
			if ctx.Err() == nil {
				launch()
			}
		}
	}
}

// step is what a partition worker does after settling a batch.
type step int

const (
	next step = iota
	again
	halt
)

// inPlace is what runPartition knows of the record it retries in place.
type inPlace struct {
	runs  int // times it was handed to the processor
	tries int // the runs that count against MaxAttempts (see spends)
}

// runPartition applies recs, all from partition k, in order: in batches,
// committing the offset after each, retrying a failing record in place and
// dead-lettering it once its budget is spent. A batch settles a prefix of
// its records and stops at the first one to retry (the processor left the
// ones after it untried), so only the partition's first record is ever
// retried in place; head is what is known of it.
func (c *Consumer[TTx]) runPartition(ctx context.Context, k tp, recs []*kgo.Record, stalled chan<- tp) {
	var head inPlace
	for len(recs) > 0 {
		n := min(len(recs), c.cfg.MaxBatch)
		if head.runs > 0 {
			// A record being retried goes alone: a batch would fail with it
			// and run its neighbours' handlers for nothing.
			n = 1
		}
		batch := recs[:n]
		settled, st := c.settle(ctx, batch, c.process(ctx, batch, head.runs), &head)
		if settled > 0 {
			c.commit(ctx, batch[settled-1])
		}
		recs = recs[settled:]
		switch {
		case st == halt || c.crashing():
			return
		case st == again:
			// Only this partition waits: drain pauses it and keeps polling
			// for the others. A wait that is not the record's fault is as
			// long as an outage, bounded by ctx.
			stalled <- k
			if sleep(ctx, c.backoff.Backoff(head.runs)) != nil {
				return
			}
		}
	}
}

// process runs one batch through the processor, in order: when a record
// must be retried, the records after it are not tried. runs is the first
// record's runs so far. A record whose event-time header is bad gets a
// DeadLettered result without touching the database; every other record,
// one without an ID included, goes to the processor, which logs and counts
// its outcome. Results are in the order of recs.
func (c *Consumer[TTx]) process(ctx context.Context, recs []*kgo.Record, runs int) []idem.Result {
	results := make([]idem.Result, len(recs))
	msgs := make([]idem.Message, 0, len(recs))
	idx := make([]int, 0, len(recs))
	noIDs := make(map[int]error)
	for i, r := range recs {
		attempt := 1
		if i == 0 {
			attempt += runs
		}
		m, noID, err := c.message(r, attempt)
		if err != nil {
			// Reported when settled: the walk may stop before this record.
			results[i] = idem.Result{Outcome: idem.DeadLettered, MessageID: m.ID, Err: err}
			continue
		}
		if noID != nil {
			noIDs[i] = noID
		}
		msgs = append(msgs, m)
		idx = append(idx, i)
	}
	if len(msgs) > 0 {
		for j, r := range c.proc.ProcessBatchInOrder(ctx, msgs) {
			if noID := noIDs[idx[j]]; noID != nil && r.Outcome == idem.DeadLettered && errors.Is(r.Err, idem.ErrNoMessageID) {
				// The dead letter says where the ID was looked for.
				r.Err = noID
			}
			results[idx[j]] = r
		}
	}
	return results
}

// settle acts on the results of one batch in order and returns how many
// records, from the first, are done with (their offset may be committed) and
// what the worker does next. head is what is known of the record being
// settled: settle counts its runs and tries and resets them when it moves
// past the record.
func (c *Consumer[TTx]) settle(ctx context.Context, recs []*kgo.Record, results []idem.Result, head *inPlace) (int, step) {
	for i, res := range results {
		r := recs[i]
		head.runs++
		if spends(res) {
			head.tries++
		}
		switch c.actionFor(ctx, res, head.tries) {
		case advance:
			*head = inPlace{}
		case deadLetter:
			// Outcomes the processor never reported: a dead letter this
			// consumer decides after its own budget, and a record it refused
			// itself. Reported once the dead letter is in its topic.
			report := res.Outcome == idem.Retry || errors.Is(res.Err, ErrBadTime)
			if res.Outcome == idem.Retry {
				res.Outcome = idem.DeadLettered
				res.Err = fmt.Errorf("%w: %d tries in place: %w", idem.ErrRetriesExhausted, head.tries, res.Err)
			}
			if err := c.deadLetter(ctx, r, res, head.tries); err != nil {
				return i, halt
			}
			if report {
				c.proc.Report(res)
			}
			*head = inPlace{}
		case retry:
			c.cfg.Logger.Warn("record will be retried in place", "consumer", c.proc.Consumer(),
				"source", source(r.Topic, r.Partition), "offset", r.Offset, "message_id", res.MessageID,
				"run", head.runs, "tries", head.tries, "max_attempts", c.cfg.MaxAttempts, "counted", spends(res), "error", res.Err)
			if c.cfg.Hooks != nil {
				c.cfg.Hooks.OnRetry(r, head.runs+1, res)
			}
			return i, again
		case stop:
			return i, halt
		}
	}
	return len(recs), next
}

// commit commits the offset after r, the last settled record of its
// partition. A failed commit is logged and left: the records will be
// redelivered to whoever owns the partition next and found in the inbox.
func (c *Consumer[TTx]) commit(ctx context.Context, r *kgo.Record) {
	if c.crashing() {
		return
	}
	offset := r.Offset + 1
	if c.cfg.Faults != nil {
		if err := c.cfg.Faults(ctx, BeforeOffsetCommit, r.Topic, r.Partition, offset); err != nil {
			c.crash(fmt.Errorf("fault at %s: %w", BeforeOffsetCommit, err))
			return
		}
	}
	// The commit outlives a cancelled ctx: at shutdown it is the commit that
	// matters most.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	var cerr error
	c.cl.CommitOffsetsSync(cctx,
		map[string]map[int32]kgo.EpochOffset{r.Topic: {r.Partition: {Epoch: r.LeaderEpoch, Offset: offset}}},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				cerr = err
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if e := kerr.ErrorForCode(p.ErrorCode); e != nil {
						cerr = e
					}
				}
			}
		})
	if c.cfg.Hooks != nil {
		c.cfg.Hooks.OnCommit(r.Topic, r.Partition, offset, cerr)
	}
	if cerr != nil {
		c.cfg.Logger.Warn("offset commit failed; the records will be redelivered and deduplicated",
			"consumer", c.proc.Consumer(), "source", source(r.Topic, r.Partition), "offset", offset, "error", cerr)
	}
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
