package inboxdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem/idemstore"
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

// recordPruned summarises, per consumer, the keys deleted at now, and
// forgets the summaries older than their keep. A prune that deleted
// markers and could not summarise them returns an error: its late
// duplicates would go unseen.
//
// The keys a DELETE prune removes (source "") join the consumer's summary
// of the day while it has room, so that however often the prune runs
// (hourly, say) a consumer keeps about one summary a day, and a processor
// checks a key against about one filter a day of Keep. A day's first
// summary is sized for the larger of these keys and the keys pruned in the
// 24 hours before (those counted up to maxSummaryKeys), plus a quarter; when it fills, another is begun, so a
// long run's summaries grow geometrically. c must be a transaction that
// serializes writers of the summaries (the dialect's SummaryLock, BEGIN
// IMMEDIATE on SQLite), since a summary is read, grown and written back;
// for a DELETE prune it is the batch's own transaction. A dropped partition (source its
// name) gets a summary of its own.
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
	table := b.D.Table.Quoted()
	for _, consumer := range consumers {
		ks := keys[consumer]
		at := now
		if source == "" {
			grown, newest, err := b.growToday(ctx, c, consumer, ks, now)
			if err != nil {
				return written, err
			}
			if grown {
				written++
				continue
			}
			if !newest.Before(at) {
				// The run filled a summary it began at now: the next one
				// is named a microsecond later (the finest time every
				// dialect stores).
				at = newest.Add(time.Microsecond)
			}
		}
		capacity := len(ks)
		if source == "" {
			var recent int64
			if err := c.QueryRow(ctx, b.D.RecentKeys, table, consumer, b.D.TimeArg(now.Add(-day))).Scan(&recent); err != nil {
				return written, fmt.Errorf("sizing the summary of pruned keys of %s: %w", consumer, err)
			}
			capacity = max(capacity, min(max(int(recent), minSummaryKeys), maxSummaryKeys)) * 5 / 4
		}
		f, err := bloom.New(max(capacity, 1), opts.FalsePositiveRate)
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
		if _, err := c.Exec(ctx, b.D.InsertSummary, table, consumer, b.D.TimeArg(at), source, int64(len(ks)), blob); err != nil {
			return written, fmt.Errorf("storing the summary of %d pruned keys of %s: %w", len(ks), consumer, err)
		}
		written++
	}
	if _, err := c.Exec(ctx, b.D.DeleteSummary, table, b.D.TimeArg(now.Add(-opts.Keep))); err != nil {
		return written, fmt.Errorf("forgetting old pruned-key summaries: %w", err)
	}
	return written, nil
}

// maxSummaryKeys bounds the capacity a day's DELETE summary is sized for
// from the keys pruned before it (3.6 MiB at 1e-6): every prune batch reads,
// grows and writes back the open summary, so its size is the cost of a
// batch; a day that prunes more keys begins more summaries.
const maxSummaryKeys = 1 << 20

// minSummaryKeys is the smallest capacity of a day's DELETE summary (14
// KiB at 1e-6), so that a trickle of pruned keys still makes one summary a
// day rather than one a run.
const minSummaryKeys = 4096

// growToday adds ks to consumer's newest summary of today's DELETE prunes
// when it has room for them, and reports whether it did, and when that
// summary was begun (zero when there is none).
func (b *Inbox) growToday(ctx context.Context, c Conn, consumer string, ks []string, now time.Time) (bool, time.Time, error) {
	table := b.D.Table.Quoted()
	var at any
	var n int64
	var blob []byte
	err := c.QueryRow(ctx, b.D.OpenSummary, table, consumer, b.D.TimeArg(now.UTC().Truncate(day))).Scan(&at, &n, &blob)
	if isNoRows(err) {
		return false, time.Time{}, nil
	}
	if err != nil {
		return false, time.Time{}, fmt.Errorf("reading today's summary of pruned keys of %s: %w", consumer, err)
	}
	begun, err := b.D.ScanTime(at)
	if err != nil {
		return false, time.Time{}, err
	}
	f := new(bloom.Filter)
	if err := f.UnmarshalBinary(blob); err != nil {
		// A summary that cannot be read is not grown; a new one begins.
		return false, begun, nil
	}
	if int(n)+len(ks) > f.Cap() {
		return false, begun, nil
	}
	for _, k := range ks {
		f.Add(k)
	}
	if blob, err = f.MarshalBinary(); err != nil {
		return false, begun, fmt.Errorf("summarising pruned keys of %s: %w", consumer, err)
	}
	if _, err := c.Exec(ctx, b.D.GrowSummary, table, consumer, b.D.TimeArg(begun), n+int64(len(ks)), blob); err != nil {
		return false, begun, fmt.Errorf("storing the summary of pruned keys of %s: %w", consumer, err)
	}
	return true, begun, nil
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
	keys   int64 // grows when the summary does: a grown summary is read again
}

// PrunedSummaries returns consumer's summaries of pruned keys, newest
// first, implementing idemstore.Store.PrunedSummaries. It lists the summaries
// stored and decodes only those it has not loaded before.
func (b *Inbox) PrunedSummaries(ctx context.Context, consumer string) ([]idemstore.PrunedSummary, error) {
	var out []idemstore.PrunedSummary
	err := b.read(ctx, func(c Conn) (err error) {
		out, err = b.PrunedSummariesIn(ctx, c, consumer)
		return err
	})
	return out, err
}

// PrunedSummariesIn is [Inbox.PrunedSummaries] read on c, a transaction
// the caller holds (a claim's own, or a ProcessTx caller's), so that no
// second connection is needed: one listing of a few rows when nothing changed since the
// last read, and the new or grown summaries when something did.
func (b *Inbox) PrunedSummariesIn(ctx context.Context, c Conn, consumer string) ([]idemstore.PrunedSummary, error) {
	var ids []summaryID
	err := c.Query(ctx, b.D.SummaryTimes, func(r Row) error {
		var at any
		var id summaryID
		if err := r.Scan(&at, &id.source, &id.keys); err != nil {
			return err
		}
		var err error
		id.at, err = b.D.ScanTime(at)
		ids = append(ids, id)
		return err
	}, b.D.Table.Quoted(), consumer)
	if err != nil {
		return nil, fmt.Errorf("listing pruned-key summaries: %w", err)
	}
	// The cache's lock is never held across a query: a reader waiting for
	// a pool connection under it would stall a claim that holds the
	// pool's last connection and wants the lock (one connection per
	// operation). A consumer's map is replaced whole, never changed in
	// place, so the one read here stays valid after the lock is let go.
	b.summaries.mu.Lock()
	have := b.summaries.sums[consumer]
	b.summaries.mu.Unlock()
	next := make(map[summaryID]*bloom.Filter, len(ids))
	out := make([]idemstore.PrunedSummary, 0, len(ids))
	for _, id := range ids {
		f := have[id]
		if f == nil {
			if f, err = b.readSummary(ctx, c, consumer, id); err != nil {
				var bad *badSummaryError
				if !errors.As(err, &bad) && !isNoRows(err) {
					// The database did not answer: no summary may be
					// left out silently, or a late duplicate would be
					// applied.
					return nil, err
				}
				// One summary that cannot be decoded (corrupt, of a
				// newer format) or was forgotten since the listing must
				// not hold the consumer: it is skipped, and said.
				b.Logger.Warn("skipping a pruned-key summary", "table", b.Label(), "consumer", consumer,
					"pruned_at", id.at, "source", id.source, "error", err)
				continue
			}
		}
		next[id] = f
		out = append(out, idemstore.PrunedSummary{Day: id.at.UTC().Truncate(day), Has: f.Has})
	}
	b.summaries.mu.Lock()
	if b.summaries.sums == nil {
		b.summaries.sums = map[string]map[summaryID]*bloom.Filter{}
	}
	b.summaries.sums[consumer] = next
	b.summaries.mu.Unlock()
	return out, nil
}

// badSummaryError is a stored summary that cannot be decoded.
type badSummaryError struct{ err error }

func (e *badSummaryError) Error() string { return e.err.Error() }
func (e *badSummaryError) Unwrap() error { return e.err }

func (b *Inbox) readSummary(ctx context.Context, c Conn, consumer string, id summaryID) (*bloom.Filter, error) {
	var blob []byte
	at := id.at
	err := c.QueryRow(ctx, b.D.ReadSummary, b.D.Table.Quoted(), consumer, b.D.TimeArg(at), id.source).Scan(&blob)
	if err != nil {
		return nil, fmt.Errorf("reading the pruned-key summary of %s at %s: %w", consumer, at.Format(time.RFC3339), err)
	}
	f := new(bloom.Filter)
	if err := f.UnmarshalBinary(blob); err != nil {
		return nil, &badSummaryError{errors.Join(fmt.Errorf("decoding the pruned-key summary of %s at %s", consumer, at.Format(time.RFC3339)), err)}
	}
	return f, nil
}
