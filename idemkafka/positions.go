package idemkafka

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Positions says whether a consumer records, in the database, how far it
// has applied each partition, and what it does when the database is behind
// the broker (docs/design.md 17).
type Positions int

const (
	// PositionsOff records no position and trusts the broker's committed
	// offsets: the default.
	PositionsOff Positions = iota
	// PositionsRewind records each partition's position in the
	// transaction of its claims (one small write per partition per
	// batch), and when a partition is assigned compares it with the
	// group's committed offset: where the database is behind (a failover
	// to a replica that lagged, a backup restored), it consumes the
	// partition again from the database's position. The inbox answers
	// Duplicate for what the database kept and applies what it lost, once.
	// A partition with no recorded position trusts the broker.
	PositionsRewind
	// PositionsRefuse records positions as PositionsRewind does, but where
	// the database is behind it does not consume the partition: the
	// consumer is not ready, and its health and log name the partition
	// and both offsets. The partition is checked again at each rebalance
	// and every Backoff.Max, so it resumes once the positions were
	// forgotten (Consumer.ForgetPositions, after a database deliberately
	// reset) or the database caught up.
	PositionsRefuse
)

// String names the setting.
func (p Positions) String() string {
	switch p {
	case PositionsOff:
		return "off"
	case PositionsRewind:
		return "rewind"
	case PositionsRefuse:
		return "refuse"
	}
	return fmt.Sprintf("Positions(%d)", int(p))
}

// vouching is what a consumer that records positions keeps between polls:
// the group generation each partition was last compared in, and the
// partitions it refuses. Only Run's goroutine writes it; Health reads the
// refusals.
type vouching struct {
	checked map[tp]int32 // the generation each partition was compared in
	gen     int32        // the generation of the last comparison

	mu      sync.Mutex
	refused map[tp]refusal
}

// refusal is a partition not consumed because the database is behind.
type refusal struct {
	db, broker int64
	since      time.Time
	checked    time.Time
}

// reason says why the partitions are refused, for health; since is the
// earliest refusal.
func (v *vouching) reason() (string, time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.refused) == 0 {
		return "", time.Time{}, false
	}
	var parts []string
	var since time.Time
	for k, r := range v.refused {
		parts = append(parts, fmt.Sprintf("%s: the database's position %d is behind the broker's committed offset %d", source(k.topic, k.partition), r.db, r.broker))
		if since.IsZero() || r.since.Before(since) {
			since = r.since
		}
	}
	slices.Sort(parts)
	return "partitions not consumed (Config.Positions is PositionsRefuse; consume them again with PositionsRewind, or forget the positions after a deliberate reset): " + strings.Join(parts, "; "), since, true
}

// wake returns when the poll must end for the next comparison: soon
// (b.Initial) while the group generation has not been compared yet (the
// member is joining, or just rebalanced), else b.Max (a partition whose
// committed offset came after the first comparison of its generation, and
// the refused partitions, are compared again then).
func (v *vouching) wake(cl *kgo.Client, b idem.Backoff) time.Time {
	_, gen := cl.GroupMetadata()
	if gen <= 0 || gen != v.gen {
		return time.Now().Add(b.Initial)
	}
	return time.Now().Add(b.Max)
}

// vouch compares, for each partition assigned in a generation it has not
// been compared in, the database's position with the group's committed
// offset, before any record of the poll is applied (the client holds
// rebalances until the poll's round ends, so the partitions are this
// member's throughout). Where the database is behind it rewinds the
// partition (SetOffsets to the database's position) or refuses it
// (PauseFetchPartitions), and in both cases drops the partition's records
// from fetches. It returns the fetches to apply.
//
// A rewound partition's records are consumed again from the database's
// position while the group's committed offset stays where it was: the
// commit marks are raised to it, so no commit moves it back, and a crash
// meanwhile rewinds again from the position the database reached.
func (c *Consumer[TTx]) vouch(ctx context.Context, fetches kgo.Fetches) kgo.Fetches {
	v := &c.vouching
	_, gen := c.cl.GroupMetadata()
	if gen <= 0 {
		return fetches
	}
	committed := assignedOffsets(c.cl)
	due := map[tp]bool{}
	for k := range committed {
		if v.checked[k] != gen {
			due[k] = true
		}
	}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if k := (tp{p.Topic, p.Partition}); len(p.Records) > 0 && v.checked[k] != gen {
			due[k] = true
		}
	})
	now := time.Now()
	var revoked map[string][]int32
	v.mu.Lock()
	for k, r := range v.refused {
		if _, ok := committed[k]; !ok {
			// Revoked: its new owner compares. The client keeps a pause
			// across assignments; this member compares again should the
			// partition come back.
			delete(v.refused, k)
			if revoked == nil {
				revoked = map[string][]int32{}
			}
			revoked[k.topic] = append(revoked[k.topic], k.partition)
			continue
		}
		if now.Sub(r.checked) >= c.cfg.Backoff.Max {
			due[k] = true
		}
	}
	v.mu.Unlock()
	if revoked != nil {
		c.cl.ResumeFetchPartitions(revoked)
	}
	if len(due) == 0 {
		v.gen = gen
		return c.dropRefused(fetches, nil)
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	ps, err := c.proc.Positions(rctx)
	cancel()
	if err != nil {
		// Nothing of these partitions is applied before they are compared:
		// the client goes back to their first record fetched, and the
		// next poll tries again.
		back := map[tp]int64{}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if k := (tp{p.Topic, p.Partition}); due[k] && len(p.Records) > 0 {
				back[k] = p.Records[0].Offset
			}
		})
		c.setOffsets(back)
		c.health.Fail(fmt.Errorf("reading the database's positions: %w", err), now)
		c.cfg.Logger.Warn("could not read the database's positions; the partitions assigned are consumed once they are compared with the broker's",
			"consumer", c.proc.Consumer(), "error", err)
		_ = sleep(ctx, c.cfg.Backoff.Initial)
		return c.dropRefused(fetches, due)
	}
	v.gen = gen
	db := make(map[string]idemstore.Position, len(ps))
	for _, p := range ps {
		db[p.Source] = p
	}
	drop := map[tp]bool{}
	rewind := map[tp]int64{}
	for k := range due {
		v.checked[k] = gen
		broker, ok := committed[k]
		p, recorded := db[source(k.topic, k.partition)]
		if !ok || broker < 0 || !recorded || p.Next >= broker {
			// No committed offset (the client's reset policy decides), no
			// position (never recorded, or forgotten: the broker is
			// trusted), or the database at or ahead of the broker.
			c.unrefuse(k)
			continue
		}
		drop[k] = true
		if c.cfg.Positions == PositionsRefuse {
			c.refuse(k, p.Next, broker, now)
			continue
		}
		rewind[k] = p.Next
		c.marks.accept(k, broker)
		c.stats.rewinds.Add(1)
		c.stats.rewound.Add(uint64(broker - p.Next))
		c.cfg.Logger.Warn("the inbox database is behind the broker: consuming the partition again from the database's position; the inbox skips what it kept and applies what it lost",
			"consumer", c.proc.Consumer(), "source", source(k.topic, k.partition),
			"database_position", p.Next, "broker_committed", broker, "records_rewound", broker-p.Next,
			"position_recorded_at", p.Updated)
	}
	c.setOffsets(rewind)
	return c.dropRefused(fetches, drop)
}

// refuse stops consuming k: the database's position db is behind the
// broker's committed offset.
func (c *Consumer[TTx]) refuse(k tp, db, broker int64, now time.Time) {
	v := &c.vouching
	v.mu.Lock()
	r, was := v.refused[k]
	if !was {
		r.since = now
	}
	r.db, r.broker, r.checked = db, broker, now
	v.refused[k] = r
	v.mu.Unlock()
	// The records polled past the committed offset are dropped: when the
	// partition is consumed again, it is from there.
	c.setOffsets(map[tp]int64{k: broker})
	c.cl.PauseFetchPartitions(map[string][]int32{k.topic: {k.partition}})
	if !was {
		c.stats.refusals.Add(1)
		c.cfg.Logger.Error("the inbox database is behind the broker: not consuming the partition (Config.Positions is PositionsRefuse)",
			"consumer", c.proc.Consumer(), "source", source(k.topic, k.partition),
			"database_position", db, "broker_committed", broker, "records_behind", broker-db)
	}
}

// unrefuse consumes k again if it was refused.
func (c *Consumer[TTx]) unrefuse(k tp) {
	v := &c.vouching
	v.mu.Lock()
	_, was := v.refused[k]
	delete(v.refused, k)
	v.mu.Unlock()
	if was {
		c.cl.ResumeFetchPartitions(map[string][]int32{k.topic: {k.partition}})
		c.cfg.Logger.Info("the inbox database is no longer behind the broker: consuming the partition again",
			"consumer", c.proc.Consumer(), "source", source(k.topic, k.partition))
	}
}

// setOffsets moves the client's position of each partition of to.
func (c *Consumer[TTx]) setOffsets(to map[tp]int64) {
	if len(to) == 0 {
		return
	}
	set := map[string]map[int32]kgo.EpochOffset{}
	for k, o := range to {
		if set[k.topic] == nil {
			set[k.topic] = map[int32]kgo.EpochOffset{}
		}
		set[k.topic][k.partition] = kgo.EpochOffset{Epoch: -1, Offset: o}
	}
	c.cl.SetOffsets(set)
}

// dropRefused removes from fetches the records of the partitions in drop
// and of those refused.
func (c *Consumer[TTx]) dropRefused(fetches kgo.Fetches, drop map[tp]bool) kgo.Fetches {
	v := &c.vouching
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(drop) == 0 && len(v.refused) == 0 {
		return fetches
	}
	for i := range fetches {
		for j := range fetches[i].Topics {
			t := &fetches[i].Topics[j]
			for n := range t.Partitions {
				p := &t.Partitions[n]
				k := tp{t.Topic, p.Partition}
				if _, refused := v.refused[k]; drop[k] || refused {
					p.Records = nil
				}
			}
		}
	}
	return fetches
}

// ForgetPositions deletes the positions the consumer recorded in the
// database and returns how many it deleted: after a database deliberately
// reset (restored to an earlier state on purpose, the lost effects not
// wanted again), the broker's committed offsets are then trusted as they
// are. A consumer that refuses a partition resumes it at its next check.
// The same as `DELETE FROM idem_inbox_positions WHERE consumer = '…'`.
func (c *Consumer[TTx]) ForgetPositions(ctx context.Context) (int64, error) {
	return c.proc.ForgetPositions(ctx)
}
