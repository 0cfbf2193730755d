package idemrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idemkit/idem"
)

// maxCountedMessages caps how many messages [retryCounts] remembers.
const maxCountedMessages = 10_000

// retryCounts counts, per message ID, the deliveries that ended in a Retry
// of the message's own making, so that a message whose error never goes
// away is dead-lettered after [Config.MaxAttempts] even on a queue that
// counts nothing (a classic queue has no delivery limit and no
// x-delivery-count). The counts live in memory: they survive reconnects,
// not a restart. When the map is full an arbitrary entry is evicted; that
// message then starts counting again, so the bound is loose only while
// more than maxCountedMessages messages fail at once.
type retryCounts struct {
	mu    sync.Mutex
	limit int
	n     map[string]int
}

func newRetryCounts(limit int) *retryCounts {
	return &retryCounts{limit: limit, n: make(map[string]int)}
}

// add counts one more Retry for id and returns its count.
func (r *retryCounts) add(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.n[id]; !ok && len(r.n) >= r.limit {
		for k := range r.n {
			delete(r.n, k)
			break
		}
	}
	r.n[id]++
	return r.n[id]
}

// forget drops id's count: the message was settled for good.
func (r *retryCounts) forget(id string) {
	r.mu.Lock()
	delete(r.n, id)
	r.mu.Unlock()
}

func (r *retryCounts) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.n)
}

// notItsFault reports whether a Retry says nothing about the message
// itself: the processor marked it Blameless (the inbox database was
// unreachable at BEGIN, or processing was cancelled), or the consumer is
// shutting down (ctx is done). Such a Retry does not count against
// [Config.MaxAttempts], and the delivery is held rather than requeued. Any
// other Retry, an unknown commit included, counts, so nothing loops forever.
func notItsFault(ctx context.Context, res idem.Result) bool {
	return ctx.Err() != nil || res.Blameless
}

// decide is the decision for one result of a batch processed under ctx:
// [VerbFor], then two rules. A Retry that is not the message's fault is
// held (kept unacked and processed again locally), so an outage does not
// spend the broker's delivery count. A Retry of the message's own making
// is counted; at [Config.MaxAttempts] it becomes a dead letter whose reason
// wraps [idem.ErrRetriesExhausted].
func (c *Consumer[TTx]) decide(ctx context.Context, res idem.Result) decision {
	d := decide(res)
	switch {
	case d.frame != Requeue:
		c.retries.forget(res.MessageID)
		return d
	case notItsFault(ctx, res):
		return decision{frame: hold, verb: hold, res: res}
	case c.cfg.MaxAttempts < 0:
		return d
	}
	n := c.retries.add(res.MessageID)
	if n < c.cfg.MaxAttempts {
		return d
	}
	c.retries.forget(res.MessageID)
	cause := res.Err
	if cause == nil {
		cause = errors.New(res.Outcome.String())
	}
	res.Outcome = idem.DeadLettered
	res.Err = fmt.Errorf("%w: %d deliveries ended in retry (MaxAttempts %d); last: %w", idem.ErrRetriesExhausted, n, c.cfg.MaxAttempts, cause)
	// The processor counted a Retry; the dead letter is this consumer's
	// decision, reported once it is sent.
	return decision{frame: DeadLetter, verb: DeadLetter, res: res, report: true}
}
