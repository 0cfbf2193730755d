package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// ErrMarkerPruned is wrapped, with [ErrExpired], by the error of a message
// refused as a probable late duplicate (Config.RefuseLate): its key was
// among the markers a prune deleted.
var ErrMarkerPruned = errors.New("marker pruned")

// errLateInShared fails a transaction in which a message was refused as a
// late duplicate after its claim, beside others that would commit its
// marker.
var errLateInShared = errors.New("a message was refused as a late duplicate after its claim, in a transaction shared with others: it is rolled back, and its messages are tried one at a time")

// refuseFreshLate reads the summaries in tx when one of fresh, just
// claimed, needs the late check and the consumer refuses late duplicates,
// and makes Expired those whose keys a prune removed since the summaries
// were last loaded. It returns the rest. A claim that inserted a key whose
// marker a prune deleted runs after that prune committed, and with it the
// key's summary (one transaction), so this read sees the summary however
// recently the processor loaded them; it costs one listing of a few rows
// on the claim's connection when nothing changed.
func (p *Processor[TTx]) refuseFreshLate(ctx context.Context, tx TTx, fresh []*item) ([]*item, error) {
	if !p.cfg.RefuseLate || !slices.ContainsFunc(fresh, p.needsLateCheck) {
		return fresh, nil
	}
	sums, err := p.store.PrunedSummariesIn(ctx, tx, p.cfg.Consumer)
	if err != nil {
		return nil, wrapStep(stepLookup, fmt.Errorf("reading pruned-key summaries: %w", err))
	}
	p.inbox.pruned.Store(&sums)
	kept := make([]*item, 0, len(fresh))
	for _, it := range fresh {
		if p.lateRefused(it) {
			// Its marker goes with the transaction's others, if any:
			// the message is not applied, and its redeliveries find it.
			it.fresh = false
			continue
		}
		kept = append(kept, it)
	}
	return kept, nil
}

// loadPruned reads the consumer's pruned-key summaries, newest first.
func (p *Processor[TTx]) loadPruned(ctx context.Context) error {
	if p.cfg.Natural {
		return nil
	}
	sums, err := p.store.PrunedSummaries(ctx, p.cfg.Consumer)
	if err != nil {
		return wrapStep(stepSettings, fmt.Errorf("reading pruned-key summaries: %w", err))
	}
	p.inbox.pruned.Store(&sums)
	return nil
}

// needsLateCheck reports whether it could be a duplicate whose marker a
// prune removed. A message the horizon accepted by a time that every copy
// of it carries cannot: its marker, had a copy been seen, is kept at least
// until that time plus the window (keep_until, or its partition's day),
// which the horizon checked is not past. That holds for the partitioned
// layout (the partition time is the key's) and for a time taken from a
// UUIDv7 ID. A broker timestamp or a producer's header may be fresh on a
// republish of a message whose marker is gone, and an untimed message, or
// one that no horizon guards (Window -1, ApplyExpired), may meet a pruned
// marker: those pay for the check.
func (p *Processor[TTx]) needsLateCheck(it *item) bool {
	if p.inbox.pruned.Load() == nil {
		return false
	}
	h := p.horizon()
	switch {
	case h.Window <= 0 || h.ApplyExpired:
		return true
	case p.partitionTime != nil:
		return false
	}
	return it.msg.Time.IsZero() || it.msg.TimeSource != TimeFromID
}

// prunedOn returns the day a prune deleted key's marker, if a summary says
// it probably did.
func (p *Processor[TTx]) prunedOn(key string) (time.Time, bool) {
	sums := p.inbox.pruned.Load()
	if sums == nil {
		return time.Time{}, false
	}
	for _, s := range *sums {
		if s.Has(key) {
			return s.Day, true
		}
	}
	return time.Time{}, false
}

// lateRefused makes it Expired when its key was pruned and the consumer
// refuses late duplicates, and reports whether it did.
func (p *Processor[TTx]) lateRefused(it *item) bool {
	if !p.cfg.RefuseLate || !p.needsLateCheck(it) {
		return false
	}
	day, ok := p.prunedOn(it.claim.Key)
	if !ok {
		return false
	}
	it.res.PrunedOn = day
	it.res.Outcome = Expired
	it.res.Err = fmt.Errorf("%w: %w on %s: the key's marker is gone, so this is probably a late duplicate (Config.RefuseLate; redrive it to a consumer without RefuseLate to apply it on purpose)",
		ErrExpired, ErrMarkerPruned, day.Format(time.DateOnly))
	return true
}

// markLate flags fresh items whose keys were pruned: applied, but probably
// a second time.
func (p *Processor[TTx]) markLate(fresh []*item) {
	for _, it := range fresh {
		if !p.needsLateCheck(it) {
			continue
		}
		if day, ok := p.prunedOn(it.claim.Key); ok {
			it.res.PrunedOn = day
			p.notes.late(p.cfg.Logger, p.cfg.Consumer, it.msg.ID, it.claim.Key, day)
		}
	}
}

func (n *notes) late(log *slog.Logger, consumer, id, key string, day time.Time) {
	n.mu.Lock()
	count, due := n.lateN.due(time.Now())
	n.mu.Unlock()
	if due {
		log.Warn("probable late duplicates applied: their keys' markers were pruned, so the inbox could not recognise them (reconcile by hand, or set Config.RefuseLate)",
			"consumer", consumer, "count", count, "example_message_id", id, "example_key", key, "pruned_on", day.Format(time.DateOnly))
	}
}
