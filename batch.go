package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// batch is ProcessBatch and ProcessBatchInOrder.
//
// Invariant: each message ends in exactly one of two states. Either it has
// its own outcome, which is reported once (bad input and expired messages
// without touching the database; the others from the shared transaction or,
// after it failed, from a transaction of their own); or it is skipped: not
// attempted because a message before it ended the walk, given a blameless
// Retry wrapping [ErrNotAttempted], and not reported, since it comes again.
// A message is skipped only when it stands after the one that ended the
// walk; out of order, bad input and expired messages are never skipped
// (they leave the stream whatever happens before them).
func (p *Processor[TTx]) batch(ctx context.Context, msgs []Message, inOrder bool) []Result {
	if len(p.tracers) == 0 {
		return p.disposeAll(p.runCall(ctx, msgs, inOrder, nil))
	}
	var endBatch func([]Result)
	if len(msgs) > 1 {
		ctx, endBatch = p.startBatch(ctx, msgs)
	}
	spans := make([]context.Context, len(msgs))
	ends := make([]func(Result), len(msgs))
	for i, m := range msgs {
		spans[i], ends[i] = p.startMessage(ctx, m)
	}
	results := p.runCall(ctx, msgs, inOrder, spans)
	for i, r := range results {
		ends[i](r)
	}
	if endBatch != nil {
		endBatch(results)
	}
	return p.disposeAll(results)
}

// disposeAll sets each result's disposition.
func (p *Processor[TTx]) disposeAll(results []Result) []Result {
	for i := range results {
		results[i].Disposition = p.Dispose(results[i])
	}
	return results
}

// runCall is the body of batch; spans are the contexts of msgs' spans, in
// the order of msgs (nil when untraced).
func (p *Processor[TTx]) runCall(ctx context.Context, msgs []Message, inOrder bool, spans []context.Context) []Result {
	start := time.Now()
	if err := p.readyWait(ctx); err != nil {
		results := make([]Result, len(msgs))
		for i, m := range msgs {
			results[i] = notReadyResult(m, err)
			p.report(results[i], time.Since(start))
		}
		return results
	}
	slab := make([]item, len(msgs))
	items := make([]*item, len(msgs))
	valid := make([]*item, 0, len(msgs))
	for i, m := range msgs {
		items[i] = &slab[i]
		p.prepareInto(items[i], m)
		if !inOrder {
			// Out of order, a message after a Retry may settle: a position
			// past it would vouch for a message not applied.
			items[i].msg.Next = 0
		}
		if spans != nil {
			items[i].ctx = spans[i]
		}
		if items[i].res.Outcome == 0 {
			valid = append(valid, items[i])
		}
	}
	if stop := p.runBatch(ctx, valid, inOrder); stop != nil {
		skipAfter(items, stop, inOrder)
	}
	if inOrder {
		p.recordTail(ctx, items)
	}
	elapsed := time.Since(start)
	results := make([]Result, len(items))
	for i, it := range items {
		if !it.skipped {
			p.report(it.res, elapsed)
		}
		results[i] = it.res
	}
	return results
}

// runBatch processes the valid messages of a batch and returns the one
// whose Retry ends the walk, or nil when every message has its outcome.
// The batch is tried once in one transaction (only an outage at BEGIN or the
// claim is waited out, for the whole batch at once). A batch that fails as
// a whole (the caller gave up, the database stayed down) fails every
// message with it; one that fails otherwise, perhaps through one poison
// message, is retried one message at a time.
func (p *Processor[TTx]) runBatch(ctx context.Context, valid []*item, inOrder bool) *item {
	switch len(valid) {
	case 0:
		return nil
	case 1:
		p.processOne(valid[0].within(ctx), valid[0], 0)
		if inOrder && valid[0].res.Outcome == Retry {
			return valid[0]
		}
		return nil
	}
	once := p.cfg.Retry
	once.MaxAttempts = 1
	v, ok := p.attempt(ctx, valid, p.retrier(once), 0)
	switch {
	case ok:
		return nil
	case v.whole:
		for _, it := range valid {
			it.res.Outcome, it.res.Err, it.res.Blameless = Retry, fmt.Errorf("%w: %w", ErrBatchFailed, v.err), v.blameless
		}
		if inOrder {
			return valid[0]
		}
		return nil
	}
	// The message whose own handler failed the batch ran once already, and
	// that run is charged to it, when the failure is its own (not an
	// outage): MaxAttempts counts every run of the handler for a message.
	if !v.blameless && classify(p.store, v.err) == idemstore.ClassTransient && storeStep(v.err) == "" {
		for _, it := range valid {
			if !it.handlerFailed {
				continue
			}
			if n := p.spent.add(it.msg.ID, 1); n >= p.cfg.Retry.MaxAttempts {
				// That run was its last: dead-letter it without another.
				p.spent.forget(it.msg.ID)
				it.exhausted = true
				it.res.Outcome, it.res.Blameless = DeadLettered, false
				it.res.Err = fmt.Errorf("%w after %d attempts: %w", ErrRetriesExhausted, n, v.err)
			}
		}
	}
	return p.oneByOne(ctx, valid, inOrder)
}

// oneByOne applies each message in a transaction of its own, so that its
// neighbours go through whatever it does, and returns the message whose
// Retry ends the walk: in order, any Retry (nothing may be applied ahead of
// it); out of order, a blameless one (the database went down meanwhile:
// the others would only wait for it in turn).
func (p *Processor[TTx]) oneByOne(ctx context.Context, valid []*item, inOrder bool) *item {
	for _, it := range valid {
		if it.exhausted {
			continue
		}
		p.processOne(it.within(ctx), it, it.res.Attempts)
		if it.res.Outcome == Retry && (inOrder || it.res.Blameless) {
			return it
		}
	}
	return nil
}

// recordTail records, in a transaction of its own, the position of a
// source whose last settled messages of the batch were settled without a
// transaction that recorded it (bad input, expired, dead-lettered after
// their handler failed): without it the database's position would stay
// behind the broker's, and a consumer comparing the two would consume
// those messages again (and dead-letter them twice). Every message before
// such a position is settled (see recordPositions), and a failure here is
// logged only: the position lags, which costs a rewind over settled
// messages, never a loss.
func (p *Processor[TTx]) recordTail(ctx context.Context, items []*item) {
	var tail, recorded map[string]int64
	for _, it := range items {
		if it.skipped || it.msg.Next <= 0 {
			continue
		}
		switch it.res.Outcome {
		case Applied, Duplicate:
			if recorded == nil {
				recorded = map[string]int64{}
			}
			recorded[it.msg.Source] = max(recorded[it.msg.Source], it.msg.Next)
		case DeadLettered, Expired:
			if tail == nil {
				tail = map[string]int64{}
			}
			tail[it.msg.Source] = max(tail[it.msg.Source], it.msg.Next)
		}
	}
	var ps []idemstore.Position
	for src, next := range tail {
		if next > recorded[src] {
			ps = append(ps, idemstore.Position{Source: src, Next: next})
		}
	}
	if len(ps) == 0 {
		return
	}
	if err := p.writePositions(ctx, ps); err != nil {
		p.cfg.Logger.Warn("recording the position after dead-lettered messages failed; the position lags, and a consumer comparing it with the broker's may consume them again",
			"consumer", p.cfg.Consumer, "error", err)
	}
}

// writePositions records ps in a transaction of their own.
func (p *Processor[TTx]) writePositions(ctx context.Context, ps []idemstore.Position) error {
	ctx = context.WithoutCancel(ctx)
	if p.cfg.CommitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.CommitTimeout)
		defer cancel()
	}
	tx, err := p.store.Begin(ctx)
	if err != nil {
		return err
	}
	if err := p.store.RecordPositions(ctx, tx, p.cfg.Consumer, ps); err != nil {
		_ = p.store.Rollback(ctx, tx)
		return err
	}
	return p.store.Commit(ctx, tx)
}

// skipAfter marks the messages after stop as not attempted. In order, bad
// input after it waits its turn too; out of order it leaves the stream now.
func skipAfter(items []*item, stop *item, inOrder bool) {
	after := false
	for _, it := range items {
		if after && (inOrder || it.res.Outcome != DeadLettered && it.res.Outcome != Expired) {
			it.skipped = true
			it.res = Result{Outcome: Retry, MessageID: it.msg.ID, Key: it.res.Key, Blameless: true,
				Err: fmt.Errorf("%w: message %s before it must be retried first", ErrNotAttempted, stop.msg.ID)}
		}
		after = after || it == stop
	}
}
