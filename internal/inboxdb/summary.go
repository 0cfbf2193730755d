package inboxdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/bloom"
	"github.com/idemkit/idem/retention"
)

// pruned gathers the keys one prune run deletes, by consumer.
type pruned map[string][]string

// add reads one (consumer, key) row.
func (p pruned) add(r Row) error {
	var consumer, key string
	if err := r.Scan(&consumer, &key); err != nil {
		return err
	}
	p[consumer] = append(p[consumer], key)
	return nil
}

// recordPruned writes one summary per consumer of the keys deleted at
// now, and forgets the summaries older than their keep. A prune that
// deleted markers and could not summarise them returns an error: its late
// duplicates would go unseen.
func (b *Inbox) recordPruned(ctx context.Context, c Conn, keys pruned, now time.Time, source string, opts retention.SummaryOptions) (int, error) {
	if opts.Keep < 0 {
		return 0, nil
	}
	written := 0
	consumers := make([]string, 0, len(keys))
	for consumer := range keys {
		consumers = append(consumers, consumer)
	}
	slices.Sort(consumers)
	for _, consumer := range consumers {
		ks := keys[consumer]
		f, err := bloom.New(len(ks), opts.FalsePositiveRate)
		if err != nil {
			return written, fmt.Errorf("summarising pruned keys of %s: %w", consumer, err)
		}
		for _, k := range ks {
			f.Add(k)
		}
		blob, err := f.MarshalBinary()
		if err != nil {
			return written, fmt.Errorf("summarising pruned keys of %s: %w", consumer, err)
		}
		if _, err := c.Exec(ctx, b.D.InsertSummary, b.D.Table.Quoted(), consumer, b.D.TimeArg(now), source, int64(len(ks)), blob); err != nil {
			return written, fmt.Errorf("storing the summary of %d pruned keys of %s: %w", len(ks), consumer, err)
		}
		written++
	}
	if _, err := c.Exec(ctx, b.D.DeleteSummary, b.D.Table.Quoted(), b.D.TimeArg(now.Add(-opts.Keep))); err != nil {
		return written, fmt.Errorf("forgetting old pruned-key summaries: %w", err)
	}
	return written, nil
}

// RecordDropped summarises the keys of a partition about to be dropped
// (read with the dialect's PartitionKeys from the quoted partition name),
// on the partition's DDL transaction.
func (b *Inbox) RecordDropped(ctx context.Context, c Conn, partition string, now time.Time, opts retention.SummaryOptions) error {
	if opts.Keep < 0 {
		return nil
	}
	keys := pruned{}
	if err := c.Query(ctx, fmt.Sprintf(b.D.PartitionKeys, partition), keys.add); err != nil {
		return fmt.Errorf("reading the keys of partition %s: %w", partition, err)
	}
	_, err := b.recordPruned(ctx, c, keys, now, partition, opts.WithDefaults())
	return err
}

// summaryCache keeps the decoded summaries a process loaded, so that the
// processors' periodic reads fetch only the summaries written since.
type summaryCache struct {
	mu   sync.Mutex
	sums map[string]map[summaryID]*bloom.Filter // by consumer
}

// summaryID names one stored summary of a consumer.
type summaryID struct {
	at     time.Time
	source string
}

// PrunedSummaries returns consumer's summaries of pruned keys, newest
// first, implementing idem.PrunedSummaryStore. It lists the summaries
// stored and decodes only those it has not loaded before.
func (b *Inbox) PrunedSummaries(ctx context.Context, consumer string) ([]idem.PrunedSummary, error) {
	var ids []summaryID
	err := b.read(ctx, func(c Conn) error {
		ids = ids[:0]
		return c.Query(ctx, b.D.SummaryTimes, func(r Row) error {
			var at any
			var id summaryID
			if err := r.Scan(&at, &id.source); err != nil {
				return err
			}
			var err error
			id.at, err = b.D.ScanTime(at)
			ids = append(ids, id)
			return err
		}, b.D.Table.Quoted(), consumer)
	})
	if err != nil {
		return nil, fmt.Errorf("listing pruned-key summaries: %w", err)
	}
	b.summaries.mu.Lock()
	defer b.summaries.mu.Unlock()
	if b.summaries.sums == nil {
		b.summaries.sums = map[string]map[summaryID]*bloom.Filter{}
	}
	have := b.summaries.sums[consumer]
	next := make(map[summaryID]*bloom.Filter, len(ids))
	out := make([]idem.PrunedSummary, 0, len(ids))
	for _, id := range ids {
		f := have[id]
		if f == nil {
			if f, err = b.readSummary(ctx, consumer, id); err != nil {
				return nil, err
			}
		}
		next[id] = f
		out = append(out, idem.PrunedSummary{Day: id.at.UTC().Truncate(day), Has: f.Has})
	}
	b.summaries.sums[consumer] = next
	return out, nil
}

func (b *Inbox) readSummary(ctx context.Context, consumer string, id summaryID) (*bloom.Filter, error) {
	var blob []byte
	at := id.at
	err := b.read(ctx, func(c Conn) error {
		return c.QueryRow(ctx, b.D.ReadSummary, b.D.Table.Quoted(), consumer, b.D.TimeArg(at), id.source).Scan(&blob)
	})
	if err != nil {
		return nil, fmt.Errorf("reading the pruned-key summary of %s at %s: %w", consumer, at.Format(time.RFC3339), err)
	}
	f := new(bloom.Filter)
	if err := f.UnmarshalBinary(blob); err != nil {
		return nil, errors.Join(fmt.Errorf("decoding the pruned-key summary of %s at %s", consumer, at.Format(time.RFC3339)), err)
	}
	return f, nil
}
