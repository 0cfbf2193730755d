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
// is logged and kept pending, to be sent again between polls (see
// [Consumer.resendPending]) unless the member left the group; until it
// lands, the records would be redelivered to whoever owns the partition
// next and found in the inbox.
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
		if sleep(cctx, c.backoff.Delay(try)) != nil {
			break
		}
	}
	idem.Each(c.hooks, func(h CommitHook) { h.OnCommit(r.Topic, r.Partition, offset, cerr) })
	if cerr == nil {
		c.accepted(k, offset)
		return true
	}
	c.stats.commitErrors.Add(1)
	c.health.Fail(fmt.Errorf("committing offset %d of %s: %w", offset, source(r.Topic, r.Partition), cerr), time.Now())
	msg := "offset commit failed; the records will be redelivered and deduplicated"
	switch {
	case c.crashing():
	case memberLeft(cerr):
		// The partitions may be another member's by now.
		c.pending.clear()
	default:
		c.pending.put(k, pendingCommit{offset: offset, epoch: r.LeaderEpoch})
		msg = "offset commit failed; it is sent again between polls while this member owns the partition (else the records are redelivered and deduplicated)"
	}
	c.cfg.Logger.Warn(msg, "consumer", c.proc.Consumer(), "source", source(r.Topic, r.Partition), "offset", offset, "error", cerr)
	return true
}

// accepted records a commit of offset on k the broker accepted.
func (c *Consumer[TTx]) accepted(k tp, offset int64) {
	c.marks.accept(k, offset)
	c.pending.settle(k, offset)
	c.stats.commits.Add(1)
	c.lag.commit(k.topic, k.partition, offset)
}

// resendPending sends the pending commits (see [pendingCommits]) again, in
// one request bounded by CommitTimeout, once their backoff has passed or
// when Run ends. Run calls it with a round's rebalance still held, so no
// partition changes hands while it runs. A pending commit is sent only
// for a partition the client counts as assigned (see [assignedOffsets]),
// which a partition with a pending commit is until it is revoked or lost:
// the client drops it then, and a pending commit of a partition it does
// not hold is dropped unsent, since the partition may be another
// member's, whose commits it would move backwards. So is one at or below
// the group's committed offset the client holds, or the partition's mark.
func (c *Consumer[TTx]) resendPending(ctx context.Context, final bool) {
	now := time.Now()
	if !final && !c.pending.isDue(now) {
		return
	}
	send := c.pending.take(c.marks.clamp(assignedOffsets(c.cl)), c.marks.covers)
	if len(send) == 0 {
		return
	}
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	for k, p := range send {
		if offsets[k.topic] == nil {
			offsets[k.topic] = make(map[int32]kgo.EpochOffset)
		}
		offsets[k.topic][k.partition] = kgo.EpochOffset{Epoch: p.epoch, Offset: p.offset}
	}
	c.stats.commitRetries.Add(uint64(len(send)))
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	errs := make(map[tp]error, len(send))
	var reqErr error
	c.cl.CommitOffsetsSync(cctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			reqErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				errs[tp{t.Topic, p.Partition}] = kerr.ErrorForCode(p.ErrorCode)
			}
		}
	})
	left := false
	for k, p := range send {
		err, answered := errs[k]
		switch {
		case reqErr != nil:
			err = reqErr
		case !answered:
			err = errors.New("the coordinator did not answer for the partition")
		}
		idem.Each(c.hooks, func(h CommitHook) { h.OnCommit(k.topic, k.partition, p.offset, err) })
		if err == nil {
			c.accepted(k, p.offset)
			c.cfg.Logger.Info("pending offset commit accepted", "consumer", c.proc.Consumer(), "source", source(k.topic, k.partition), "offset", p.offset)
			continue
		}
		if memberLeft(err) {
			left = true
			continue
		}
		c.pending.retry(k, p)
		c.cfg.Logger.Debug("pending offset commit refused; trying again later", "consumer", c.proc.Consumer(), "source", source(k.topic, k.partition), "offset", p.offset, "error", err)
	}
	if left {
		c.pending.clear()
	}
	c.pending.schedule(now, c.backoff)
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
		if ke == kerr.UnknownTopicOrPartition || ke == kerr.UnknownTopicID {
			// Retriable to the client (metadata may lag), but a commit's
			// topic that the coordinator does not know was deleted: trying
			// again would hold the round and the rebalance for nothing.
			return false
		}
		// REBALANCE_IN_PROGRESS rarely clears while the round holds the
		// rebalance; CommitTimeout bounds the tries, and a commit still
		// refused stays pending for the next round.
		return ke.Retriable || ke == kerr.RebalanceInProgress
	}
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed)
}

// assignedOffsets returns, for each partition the client counts as
// assigned to the member, the group's committed offset of it, or -1 when
// it has none: the partitions of the client's committed offsets (fetched
// at each assignment, raised by each accepted commit) and of its
// uncommitted ones (the partitions it consumed past their committed
// offset, as a partition with a pending commit is). The client drops a
// revoked or lost partition from both, and fills them anew for a new
// assignment.
func assignedOffsets(cl *kgo.Client) map[tp]int64 {
	out := make(map[tp]int64)
	for t, ps := range cl.UncommittedOffsets() {
		for p := range ps {
			out[tp{t, p}] = -1
		}
	}
	for t, ps := range cl.CommittedOffsets() {
		for p, eo := range ps {
			out[tp{t, p}] = eo.Offset
		}
	}
	return out
}

// memberLeft reports whether the coordinator refused a commit because the
// member left the group or was replaced: its partitions may be another
// member's, and it commits none of them again.
func memberLeft(err error) bool {
	return errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.IllegalGeneration) || errors.Is(err, kerr.FencedInstanceID)
}

// pendingCommits holds, per partition, the last commit that still failed
// after CommitTimeout: without it, a partition whose last records were
// settled when the coordinator was away would keep its committed offset
// behind its end (a lag that never goes, records redelivered at the next
// assignment) until a later record comes. Run sends them again between
// polls, with backoff ([Consumer.resendPending]).
//
// Invariants: a pending commit is above the partition's mark when it is
// put; it is removed when a commit at or above it is accepted, when the
// coordinator says the member left the group (all of them), and unsent
// when it is taken after a rebalance for a partition the client no longer
// counts as assigned (see [Consumer.resendPending]).
type pendingCommits struct {
	mu   sync.Mutex
	m    map[tp]pendingCommit
	try  int       // re-sends since the last commit that landed or the first failure
	next time.Time // when the next re-send is due
}

// pendingCommit is a commit to send again: the offset and the leader epoch
// of the record before it.
type pendingCommit struct {
	offset int64
	epoch  int32
}

func (p *pendingCommits) put(k tp, c pendingCommit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[tp]pendingCommit)
	}
	if old, ok := p.m[k]; ok && old.offset > c.offset {
		return
	}
	if len(p.m) == 0 {
		p.try, p.next = 0, time.Time{}
	}
	p.m[k] = c
}

// retry puts back a pending commit that take removed and that was refused
// again, unless a later one of its partition was put meanwhile.
func (p *pendingCommits) retry(k tp, c pendingCommit) { p.put(k, c) }

// settle removes the pending commit of k at or below offset, accepted.
func (p *pendingCommits) settle(k tp, offset int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.m[k]; ok && c.offset <= offset {
		delete(p.m, k)
	}
}

func (p *pendingCommits) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m = nil
}

// due returns when the next re-send is due, and false when none is
// pending.
func (p *pendingCommits) due() (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next, len(p.m) > 0
}

func (p *pendingCommits) isDue(now time.Time) bool {
	next, ok := p.due()
	return ok && !now.Before(next)
}

// take removes and returns the pending commits to send. assigned holds
// the group's committed offset of each partition the client counts as
// assigned (see [assignedOffsets]). A pending commit whose partition is
// not there is dropped, and so is one at or below its partition's offset
// there or covered by its mark.
func (p *pendingCommits) take(assigned map[tp]int64, covered func(tp, int64) bool) map[tp]pendingCommit {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[tp]pendingCommit, len(p.m))
	for k, c := range p.m {
		delete(p.m, k)
		if covered(k, c.offset) {
			continue
		}
		if committed, ok := assigned[k]; !ok || committed >= c.offset {
			continue
		}
		out[k] = c
	}
	return out
}

// schedule sets when the re-send after the one made at now is due.
func (p *pendingCommits) schedule(now time.Time, b idem.Backoff) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) == 0 {
		p.try, p.next = 0, time.Time{}
		return
	}
	p.try++
	p.next = now.Add(b.Delay(p.try))
}

// commitMarks holds, per partition, the highest offset the broker accepted
// from this consumer.
//
// Invariant: a commit is sent only above the mark, so this consumer never
// moves a partition's committed offset backwards when the client's
// position moves back over records that are still in the log (a record
// given up at a rebalance and fetched again). A mark outlives the
// partition's assignment: a member that gets the partition resumes from
// the group's committed offset, which is at or above the mark, so the mark
// never holds back a commit that moves the offset forward.
//
// The one exception is a log the client reports truncated (kgo.ErrDataLoss:
// the new leader's log ends below what the client consumed, after an
// unclean leader election). The records from the reset position on are
// then other records than those committed past, not yet applied, and the
// committed offset must come back to them, or a next owner of the
// partition would start past them and never apply them: the mark is
// lowered to the reset position ([Consumer.dataLoss]).
type commitMarks struct {
	mu sync.Mutex
	m  map[tp]int64
	// truncated holds, per partition, where the client resumed after it
	// reported the log truncated, until a commit is accepted again: the
	// group's committed offset the client holds is above it until then.
	truncated map[tp]int64
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
	delete(c.truncated, k)
}

// lower lowers the mark of k to offset, after the log was truncated there.
func (c *commitMarks) lower(k tp, offset int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if mark, ok := c.m[k]; ok && mark > offset {
		c.m[k] = offset
	}
	if c.truncated == nil {
		c.truncated = make(map[tp]int64)
	}
	c.truncated[k] = offset
}

// clamp lowers, in the committed offsets the client holds, those of
// partitions truncated since their last accepted commit to where the
// client resumed: a pending commit above that point is not yet committed,
// whatever the client remembers of the group's offset before the
// truncation.
func (c *commitMarks) clamp(committed map[tp]int64) map[tp]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, at := range c.truncated {
		if o, ok := committed[k]; ok && o > at {
			committed[k] = at
		}
	}
	return committed
}

// drop removes the pending commit of k above offset: after the log was
// truncated at offset, it would commit past records not applied yet.
func (p *pendingCommits) drop(k tp, offset int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.m[k]; ok && c.offset > offset {
		delete(p.m, k)
	}
}

// dataLoss takes the client's report that the log of a partition was
// truncated below what it had consumed (see [commitMarks]): the mark is
// lowered to where the client resumes, a pending commit above it is
// dropped, and the report goes to the log, the counters and the
// [DataLossHook]s. The records from there on are applied as they come
// (those that are the same as before are found in the inbox) and
// committed again from there.
func (c *Consumer[TTx]) dataLoss(e *kgo.ErrDataLoss) {
	k := tp{e.Topic, e.Partition}
	c.marks.lower(k, e.ResetTo)
	c.pending.drop(k, e.ResetTo)
	c.stats.dataLosses.Add(1)
	c.cfg.Logger.Warn("the broker's log of a partition ends below what was consumed; consuming and committing again from where the client resumed",
		"consumer", c.proc.Consumer(), "source", source(e.Topic, e.Partition), "consumed_to", e.ConsumedTo, "reset_to", e.ResetTo)
	idem.Each(c.hooks, func(h DataLossHook) { h.OnDataLoss(e.Topic, e.Partition, e.ConsumedTo, e.ResetTo) })
}
