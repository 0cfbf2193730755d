package idemkafka

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// tp is a topic partition.
type tp struct {
	topic     string
	partition int32
}

// fetcher is what a round needs of the client; *kgo.Client has it.
type fetcher interface {
	PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
	SetOffsets(map[string]map[int32]kgo.EpochOffset)
}

// worker applies recs, all from partition k and in offset order, and
// returns the ones it did not settle. It gives up (returns as soon as it
// can, settling nothing more) when stop is closed. [Consumer.runPartition]
// is the worker of Run.
type worker func(ctx context.Context, stop <-chan struct{}, k tp, recs []*kgo.Record) (rest []*kgo.Record)

// round is the processing of one poll, and of the polls it makes while some
// of its partitions wait to retry a record. The group's rebalance waits
// until the round ends (BlockRebalanceOnPoll); Run allows it then.
//
// Each event is a method (add, launch, finished, pollDone, giveUp);
// between events these hold:
//   - every record taken from the client is in exactly one place: in its
//     partition's queue, or in the hands of the partition's one worker;
//     a queue keeps offset order;
//   - running counts the parts with a worker; a partition's fetching is
//     paused exactly while it has a worker (the client keeps its position
//     at the first record not taken), so that a slow or retried record
//     holds its own partition only;
//   - an extra poll runs while some worker runs and the round is not
//     stopping, so that the other partitions flow (after a poll that
//     brought only errors, not before pollWait, and never once the client
//     is closed);
//   - once stopping (a rebalance waits for the round, or Run's context
//     ended), no worker starts; the records left in the queues when the
//     last worker returned are given up: their partition is rewound to the
//     first of them, so that the next poll of whichever member owns the
//     partition returns them again. Nothing past them is committed.
type round struct {
	fetch   fetcher
	work    worker
	maxPoll int
	// grace is how long the workers' batches may go on once a rebalance
	// waits; then workCtx is cancelled.
	grace time.Duration
	log   *slog.Logger
	stats *counters
	// observe, when set, sees every poll of the round (for the
	// consumer's health).
	observe func(kgo.Fetches)

	ctx        context.Context // Run's
	workCtx    context.Context // the workers'
	cancelWork context.CancelFunc
	rebalance  <-chan struct{} // closed when a rebalance waits for the round
	stop       chan struct{}   // closed when the round starts stopping
	stopping   bool
	graceTimer *time.Timer

	parts   map[tp]*part
	running int
	polling bool
	// cancelPoll ends the extra poll; nil once called or when none runs.
	cancelPoll context.CancelFunc
	// pollPause is set after an extra poll that brought only errors (a
	// broker that keeps refusing answers at once): no poll starts until
	// it fires. noPoll is set once the client is closed.
	pollPause <-chan time.Time
	noPoll    bool
	pollWait  time.Duration

	done   chan finished
	polled chan kgo.Fetches
}

// part is one partition's share of a round.
type part struct {
	queue   []*kgo.Record
	running bool
}

// finished is a worker's return.
type finished struct {
	k    tp
	rest []*kgo.Record
}

func newRound(ctx context.Context, fetch fetcher, work worker, maxPoll int, grace time.Duration, rebalance <-chan struct{}, log *slog.Logger, stats *counters) *round {
	workCtx, cancel := context.WithCancel(ctx)
	return &round{
		fetch: fetch, work: work, maxPoll: maxPoll, grace: grace, log: log, stats: stats, pollWait: 100 * time.Millisecond,
		ctx: ctx, workCtx: workCtx, cancelWork: cancel, rebalance: rebalance,
		stop:  make(chan struct{}),
		parts: make(map[tp]*part),
		done:  make(chan finished), polled: make(chan kgo.Fetches),
	}
}

// run processes fetches and returns once every worker returned and the
// records left over are given up.
func (r *round) run(fetches kgo.Fetches) {
	defer r.end()
	r.add(fetches)
	r.launch()
	ctxDone := r.ctx.Done()
	for r.running > 0 || r.polling {
		r.steerPoll()
		select {
		case f := <-r.done:
			r.finished(f)
		case f := <-r.polled:
			r.pollDone(f)
		case <-r.pollPause:
			r.pollPause = nil
		case <-r.rebalance:
			r.rebalance = nil
			r.giveUp(true)
		case <-ctxDone:
			ctxDone = nil
			r.giveUp(false)
		}
	}
}

// add queues the records of f by partition.
func (r *round) add(f kgo.Fetches) {
	if r.observe != nil {
		r.observe(f)
	}
	f.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
			r.log.Warn("fetch error", "source", source(topic, partition), "error", err)
		}
	})
	f.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		k := tp{p.Topic, p.Partition}
		w := r.parts[k]
		if w == nil {
			w = &part{}
			r.parts[k] = w
		}
		w.queue = append(w.queue, p.Records...)
		if r.stats != nil {
			r.stats.delivered.Add(uint64(len(p.Records)))
		}
	})
}

// launch gives each idle partition with queued records a worker, and
// pauses its fetching, unless the round is stopping.
func (r *round) launch() {
	if r.stopping {
		return
	}
	pause := make(map[string][]int32)
	for k, w := range r.parts {
		if w.running || len(w.queue) == 0 {
			continue
		}
		recs := w.queue
		w.queue, w.running = nil, true
		r.running++
		pause[k.topic] = append(pause[k.topic], k.partition)
		go func() {
			rest := r.work(r.workCtx, r.stop, k, recs)
			r.done <- finished{k, rest}
		}()
	}
	if len(pause) > 0 {
		r.fetch.PauseFetchPartitions(pause)
	}
}

// finished takes a worker's return: its partition is resumed, what it left
// goes back to the head of the queue, and the queue gets a new worker.
func (r *round) finished(f finished) {
	w := r.parts[f.k]
	w.running = false
	r.running--
	if len(f.rest) > 0 {
		w.queue = slices.Concat(f.rest, w.queue)
	}
	r.fetch.ResumeFetchPartitions(map[string][]int32{f.k.topic: {f.k.partition}})
	r.launch()
}

// steerPoll starts the extra poll while some worker runs, and ends it when
// none does or the round stops; what it returns meanwhile is queued all the
// same.
func (r *round) steerPoll() {
	want := r.running > 0 && !r.stopping && !r.noPoll && r.pollPause == nil
	switch {
	case want && !r.polling:
		pctx, cancel := context.WithCancel(r.ctx)
		r.polling, r.cancelPoll = true, cancel
		go func() { r.polled <- r.fetch.PollRecords(pctx, r.maxPoll) }()
	case !want && r.cancelPoll != nil:
		r.cancelPoll()
		r.cancelPoll = nil
	}
}

func (r *round) pollDone(f kgo.Fetches) {
	r.polling = false
	if r.cancelPoll != nil {
		r.cancelPoll()
		r.cancelPoll = nil
	}
	switch {
	case f.IsClientClosed():
		r.noPoll = true
	case f.NumRecords() == 0 && len(f.Errors()) > 0 && r.ctx.Err() == nil:
		r.pollPause = time.After(r.pollWait)
	}
	r.add(f)
	r.launch()
}

// giveUp stops the round: the workers stop retrying and start no new
// batch. For a rebalance, the batches in flight get grace to finish (what
// they settle is committed); for Run's end they were cancelled with Run's
// context.
func (r *round) giveUp(rebalance bool) {
	if r.stopping {
		return
	}
	r.stopping = true
	close(r.stop)
	if rebalance {
		r.graceTimer = time.AfterFunc(r.grace, r.cancelWork)
		r.log.Info("a rebalance waits: giving up the records not settled", "workers", r.running, "grace", r.grace)
	}
}

// end rewinds each partition with records left to the first of them.
func (r *round) end() {
	if r.graceTimer != nil {
		r.graceTimer.Stop()
	}
	r.cancelWork()
	rewind := make(map[string]map[int32]kgo.EpochOffset)
	n := 0
	for k, w := range r.parts {
		if len(w.queue) == 0 {
			continue
		}
		if rewind[k.topic] == nil {
			rewind[k.topic] = make(map[int32]kgo.EpochOffset)
		}
		first := w.queue[0]
		rewind[k.topic][k.partition] = kgo.EpochOffset{Epoch: first.LeaderEpoch, Offset: first.Offset}
		n += len(w.queue)
	}
	if n == 0 {
		return
	}
	r.fetch.SetOffsets(rewind)
	if r.stats != nil {
		r.stats.givenUp.Add(uint64(n))
	}
	r.log.Debug("records given up, partitions rewound", "records", n, "partitions", len(rewind))
}
