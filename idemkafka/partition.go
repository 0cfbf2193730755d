package idemkafka

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idem"
	"github.com/twmb/franz-go/pkg/kgo"
)

// runPartition is the worker of Run (see [worker]): it applies recs in
// batches, commits the offset after each, and retries a record in place
// when the processor's disposition says so.
//
// Invariant, at the top of each turn: recs[0] is the partition's first
// record not settled; every record before it was applied, was a duplicate
// or is durable in its dead-letter topic, and its offset was committed (or
// the commit failed, was logged, and those records will be found in the
// inbox when they come back). Only recs[0] is ever retried: a batch stops at
// the first record to retry (the processor leaves the ones after it
// untried), and that record then runs alone, so that its neighbours'
// handlers do not run for nothing. runs counts its runs, for
// idem.Message.Attempt only: how often it may run is the processor's
// decision.
func (c *Consumer[TTx]) runPartition(ctx context.Context, stop <-chan struct{}, k tp, recs []*kgo.Record) []*kgo.Record {
	runs := 0
	for len(recs) > 0 {
		if closed(stop) || c.crashing() {
			return recs
		}
		n := min(len(recs), c.cfg.MaxBatch)
		if runs > 0 {
			n = 1
		}
		batch := recs[:n]
		results := c.process(ctx, batch, runs)
		s := c.settler.settle(ctx, batch, results)
		if s.n > 0 {
			// The settlements are reported only once their commit was sent:
			// a crash before it leaves the records to redelivery, where
			// they are settled (and reported) again.
			if c.commit(ctx, batch[s.n-1]) {
				for i, d := range s.done {
					c.onSettle(batch[i], d, results[i])
				}
			}
			runs = 0
		}
		recs = recs[s.n:]
		switch {
		case s.halt:
			return recs
		case s.retry:
			c.onSettle(recs[0], s.d, s.res)
			runs++
			idem.Each(c.hooks, func(h RetryHook) { h.OnRetry(recs[0], runs+1, s.res) })
			// Only this partition waits: the round keeps polling for the
			// others.
			if !pause(ctx, stop, s.delay) {
				return recs
			}
		}
	}
	return nil
}

// settler turns the results of one batch into broker actions, in order,
// each by the disposition the processor gave it (Result.Disposition). Its
// function field is the consumer's dead-letter producer; tests give their
// own.
type settler struct {
	deadLetter func(ctx context.Context, r *kgo.Record, res idem.Result) error
	minDelay   time.Duration // the wait when a disposition names none
	stats      *counters
}

// settled is what a batch's settlement came to: its first n records are
// done with (their offset may be committed; done holds their
// dispositions); then either all are, or the next one is to be retried
// after delay (d and res are its disposition and result), or the worker
// must stop (halt: a dead letter could not be produced before the context
// ended).
type settled struct {
	n     int
	done  []idem.Disposition
	retry bool
	delay time.Duration
	d     idem.Disposition
	res   idem.Result
	halt  bool
}

// settle acts on results, those of recs in order, and stops at the first
// record that is not done with. It decides nothing: verbFor maps the
// processor's disposition.
func (s *settler) settle(ctx context.Context, recs []*kgo.Record, results []idem.Result) settled {
	done := make([]idem.Disposition, 0, len(results))
	for i, res := range results {
		d := res.Disposition
		switch verbFor(d) {
		case commit:
			if res.Outcome == idem.Duplicate {
				s.stats.duplicates.Add(1)
			} else {
				s.stats.applied.Add(1)
			}
		case deadLetter:
			if err := s.deadLetter(ctx, recs[i], res); err != nil {
				return settled{n: i, done: done, halt: true}
			}
			s.stats.deadLettered.Add(1)
		case retry:
			if d.Action == idem.ActionRedeliver {
				s.stats.retried.Add(1)
			} else {
				s.stats.held.Add(1)
			}
			delay := d.Delay
			if delay <= 0 {
				delay = s.minDelay
			}
			return settled{n: i, done: done, retry: true, delay: delay, d: d, res: res}
		}
		done = append(done, d)
	}
	return settled{n: len(results), done: done}
}

// onSettle tells the settle step (idembroker.Settler) what was done
// with r: for a record done with, once its offset commit was sent.
func (c *Consumer[TTx]) onSettle(r *kgo.Record, d idem.Disposition, res idem.Result) {
	c.kit.Settle(source(r.Topic, r.Partition), d, res, time.Now())
}

// process runs one batch through the processor, in order: when a record
// must be retried, the records after it are not tried. runs is how often
// the first record ran before. Every record, one without an ID or with a bad
// event-time header included, goes to the processor, which decides, logs
// and counts its outcome. Results are in the order of recs.
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
		m, noID := c.message(r, attempt)
		if noID != nil {
			noIDs[i] = noID
		}
		msgs = append(msgs, m)
		idx = append(idx, i)
	}
	if len(msgs) > 0 {
		busy := c.health.Begin(time.Now())
		defer func() { c.health.End(busy, time.Now()) }()
		for j, r := range c.proc.ProcessBatchInOrder(ctx, msgs) {
			if noID := noIDs[idx[j]]; noID != nil && r.Outcome == idem.DeadLettered && errors.Is(r.Err, idem.ErrNoMessageID) {
				// The dead letter says where the ID was looked for.
				r.Err = noID
				r.Disposition = c.proc.Dispose(r)
			}
			results[idx[j]] = r
		}
	}
	return results
}

// pause waits d; it reports false when ctx ended or stop closed first.
func pause(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
