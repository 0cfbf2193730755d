package idemkafka

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/idembroker"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Health reports the consumer's state for probes and status pages
// ([idembroker.HandleHealth]): whether Run runs, whether the client is a member
// of its group (and its last poll did not fail), whether it holds records
// because the inbox database is unreachable (since when and why), when a
// record was last settled, the last error, and the lag of each partition
// it holds: the high watermark of the partition's last fetch minus the
// offset the group resumes from. The lag is as fresh as the last fetch of
// the partition: a partition whose record is held or retried is not
// fetched meanwhile, so its lag stays what it was when that record came
// (the records produced since are not in it). Health asks neither the
// broker nor the database.
func (c *Consumer[TTx]) Health() idembroker.Health {
	h := c.health.Health()
	_, gen := c.cl.GroupMetadata()
	h.Connected = h.Running && gen > 0 && !c.pollFailed.Load()
	if !h.Connected {
		h.ConnectedSince = time.Time{}
	}
	h.Lag, h.TotalLag = c.lag.lags(c.cl.CommittedOffsets())
	if why, since, refused := c.vouching.reason(); refused && h.Running {
		h.Holding, h.HoldReason = true, why
		if h.HoldingSince.IsZero() || since.Before(h.HoldingSince) {
			h.HoldingSince = since
		}
	}
	return h
}

// lagTracker keeps what the lag of each partition is computed from: the
// high watermarks the fetches carried, the offsets the consumer
// committed, and where it started on a partition it has not committed
// yet. It forgets everything at a rebalance, since the partitions may
// then go to another member, and learns again from the next fetches.
type lagTracker struct {
	mu        sync.Mutex
	hw        map[tp]int64
	committed map[tp]int64
	start     map[tp]int64 // the first offset fetched, for a partition with no commit yet
}

// observe takes the high watermarks and first offsets of a poll.
func (l *lagTracker) observe(f kgo.Fetches) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f.EachPartition(func(p kgo.FetchTopicPartition) {
		if p.Err != nil {
			return
		}
		if l.hw == nil {
			l.hw, l.committed, l.start = map[tp]int64{}, map[tp]int64{}, map[tp]int64{}
		}
		k := tp{p.Topic, p.Partition}
		l.hw[k] = p.HighWatermark
		if _, ok := l.start[k]; !ok && len(p.Records) > 0 {
			l.start[k] = p.Records[0].Offset
		}
	})
}

// commit records an offset the broker accepted.
func (l *lagTracker) commit(topic string, partition int32, offset int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hw == nil {
		return
	}
	l.committed[tp{topic, partition}] = offset
}

// reset forgets every partition.
func (l *lagTracker) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hw, l.committed, l.start = nil, nil, nil
}

// lags returns each known partition's lag, in topic and partition order,
// and their sum. group is the client's view of the group's commits.
func (l *lagTracker) lags(group map[string]map[int32]kgo.EpochOffset) ([]idembroker.PartitionLag, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []idembroker.PartitionLag
	var total int64
	for k, hw := range l.hw {
		committed, ok := l.committed[k]
		if !ok {
			if eo, found := group[k.topic][k.partition]; found {
				committed, ok = eo.Offset, true
			}
		}
		if !ok {
			committed, ok = l.start[k]
		}
		if !ok {
			continue
		}
		lag := max(hw-committed, 0)
		total += lag
		out = append(out, idembroker.PartitionLag{Topic: k.topic, Partition: k.partition, HighWatermark: hw, Committed: committed, Lag: lag})
	}
	slices.SortFunc(out, func(a, b idembroker.PartitionLag) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	return out, total
}

// observePoll records what a poll says about the consumer's health: its
// partitions' high watermarks, and whether the broker failed it (a poll
// that brought only errors) or served it.
func (c *Consumer[TTx]) observePoll(f kgo.Fetches) {
	if len(f) == 0 {
		// A poll the consumer ended itself (see [Consumer.poll]): it says
		// nothing about the broker.
		return
	}
	c.lag.observe(f)
	var failed error
	errs := 0
	f.EachError(func(_ string, _ int32, err error) {
		if dl := (*kgo.ErrDataLoss)(nil); errors.As(err, &dl) {
			// The broker answered: a truncated log is not an outage.
			c.dataLoss(dl)
			return
		}
		errs++
		if failed == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
			failed = err
		}
	})
	switch {
	case f.NumRecords() > 0 || failed == nil && errs == 0:
		c.pollFailed.Store(false)
		c.health.Connect(time.Now())
	case failed != nil:
		c.pollFailed.Store(true)
		c.health.Disconnect(failed, time.Now())
	}
}

// topicsOf names what cl consumes, for Health.Source.
func topicsOf(cl *kgo.Client) string {
	topics, _ := cl.OptValue(kgo.ConsumeTopics).([]string)
	return strings.Join(topics, ",")
}

// recheck runs the inbox check again, with backoff, for as long as the
// hold that an unreachable database at start began lasts: otherwise a
// consumer of an idle topic would say it holds records long after the
// database answered, since only an applied record ends a hold. It ends
// with the hold, or when stop is called.
func (c *Consumer[TTx]) recheck(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for try := 1; c.health.Health().Holding; try++ {
			if sleep(ctx, c.cfg.Backoff.Delay(try)) != nil {
				return
			}
			cctx, ccancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
			err := c.proc.Check(cctx)
			ccancel()
			if err == nil {
				c.health.Reachable(time.Now())
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
