package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// commit commits the offset after r, the last settled record of its
// partition, and reports whether the records up to r may be reported as
// done: false when the consumer crashed, before or at the fault point.
//
// It is called only while a round runs, so the partition is this member's
// (the client holds any rebalance until the round ends, see
// [GroupOptions]). That is what makes a retry safe: a commit the
// coordinator refused because it moved, was loading or was completing a
// rebalance is sent again, with the member's current generation, until it
// is accepted, the coordinator says the member is no longer in the group
// (its partitions are someone else's: nothing more is sent), or
// CommitTimeout has passed since the first try. A commit that still failed
// is logged and left: the records will be redelivered to whoever owns the
// partition next and found in the inbox.
//
// An offset at or below one the broker already accepted from this consumer
// is not sent (see [commitMarks]).
func (c *Consumer[TTx]) commit(ctx context.Context, r *kgo.Record) bool {
	if c.crashing() {
		return false
	}
	k, offset := tp{r.Topic, r.Partition}, r.Offset+1
	if c.cfg.Faults != nil {
		if err := c.cfg.Faults(ctx, BeforeOffsetCommit, r.Topic, r.Partition, offset); err != nil {
			c.crash(fmt.Errorf("fault at %s: %w", BeforeOffsetCommit, err))
			return false
		}
	}
	if c.marks.covers(k, offset) {
		// The client rewound (a record given up and fetched again, a
		// position reset after suspected data loss): these records were
		// settled and committed before.
		return true
	}
	// The commit outlives a cancelled ctx: at shutdown it is the commit that
	// matters most.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	var cerr error
	for try := 1; ; try++ {
		cerr = c.commitOnce(cctx, r, offset)
		if cerr == nil || !retriable(cerr) || c.crashing() {
			break
		}
		c.stats.commitRetries.Add(1)
		c.cfg.Logger.Debug("offset commit refused; trying again", "consumer", c.proc.Consumer(), "source", source(r.Topic, r.Partition), "offset", offset, "try", try, "error", cerr)
		if sleep(cctx, c.backoff.Backoff(try)) != nil {
			break
		}
	}
	idem.Each(c.hooks, func(h CommitHook) { h.OnCommit(r.Topic, r.Partition, offset, cerr) })
	if cerr == nil {
		c.marks.accept(k, offset)
		c.stats.commits.Add(1)
		c.lag.commit(r.Topic, r.Partition, offset)
		return true
	}
	c.stats.commitErrors.Add(1)
	c.health.Fail(fmt.Errorf("committing offset %d of %s: %w", offset, source(r.Topic, r.Partition), cerr), time.Now())
	c.cfg.Logger.Warn("offset commit failed; the records will be redelivered and deduplicated",
		"consumer", c.proc.Consumer(), "source", source(r.Topic, r.Partition), "offset", offset, "error", cerr)
	return true
}

// commitOnce sends one commit and returns the error of the request or of
// the partition.
func (c *Consumer[TTx]) commitOnce(ctx context.Context, r *kgo.Record, offset int64) error {
	var cerr error
	c.cl.CommitOffsetsSync(ctx,
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
	return cerr
}

// retriable reports whether a refused commit may be sent again by a member
// that still owns the partition: the coordinator moved, is loading or did
// not answer in time (the client retries these itself as well, until its
// own retries run out), the group is completing a rebalance, or the
// connection failed. Not when the coordinator says the member left the
// group or was replaced (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
// FENCED_INSTANCE_ID: the partition may be another member's by now, and
// the coordinator refuses its commits for good), nor for any other refusal
// (authorization, an unknown topic), nor once the commit's time is up or
// the client closed.
func retriable(err error) bool {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Retriable || ke == kerr.RebalanceInProgress
	}
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed)
}

// commitMarks holds, per partition, the highest offset the broker accepted
// from this consumer.
//
// Invariant: a commit is sent only above the mark, so this consumer never
// moves a partition's committed offset backwards, however the client's
// position moves back (a record given up at a rebalance and fetched again,
// a position reset after the client suspected data loss at a leader
// change). A mark outlives the partition's assignment: a member that gets
// the partition resumes from the group's committed offset, which is at or
// above the mark, so the mark never holds back a commit that moves the
// offset forward.
type commitMarks struct {
	mu sync.Mutex
	m  map[tp]int64
}

// covers reports whether offset is at or below the mark of k.
func (c *commitMarks) covers(k tp, offset int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	mark, ok := c.m[k]
	return ok && offset <= mark
}

// accept raises the mark of k to offset.
func (c *commitMarks) accept(k tp, offset int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[tp]int64)
	}
	c.m[k] = max(c.m[k], offset)
}
