// Package retention is what the inbox stores share about forgetting markers
// safely: the options and result of a prune, the metrics hooks, and the
// invariant that makes forgetting safe. The prune SQL of every dialect lives
// with the rest of the inbox SQL, in package internal/inboxdb.
//
// # The invariant
//
// A marker is never removed while a message that maps to it can still be
// accepted. Three rules make it true:
//
//   - The window W is stored with the inbox table (written by its
//     migration, changed only by an explicit, logged SetWindow). Every
//     consumer guards with a horizon no longer than W; every prune and
//     partition drop removes by a window no shorter than W.
//   - The processor's horizon guard ([idem.Horizon]) accepts a message at
//     time t only if its event time E satisfies E >= t - (W - Skew), and,
//     on the partitioned layout, only if its partition time P satisfies
//     P >= t - (W - Skew) as well. Event times more than an hour ahead of
//     the consumer's clock are not trusted (the message is treated as
//     untimed), and the stores bound keep_until to an hour past the
//     database's now whatever they are given, so no marker is kept
//     arbitrarily far into the future, and none is re-read by every prune.
//   - The Skew (5 minutes by default) absorbs what separates the clocks:
//     the consumer's running behind the database's, and the time a message
//     spends between the guard and its claim. Both must stay below it.
//
// # Plain layout: keep_until
//
// Each marker carries keep_until, the time its retention is counted from. The
// claim writes keep_until = greatest(now, E) for the message that wrote it; a
// later message that meets the marker (a Duplicate) with a newer event time
// E' raises it to E' ([idemstore.Store.Extend]: only upward, and with no
// write when nothing grows). So at any moment
//
//	keep_until >= E  for every message accepted so far that maps to the marker.
//
// A prune running at p removes a marker only if keep_until < p - W, by the
// database's clock, in batches driven by the keep_until index. Suppose a
// prune at p removed the marker of key k, and a delivery of a message m
// that was already seen (a redelivery, a republish, a replay) comes at
// t >= p. m met the marker when it was first seen, so keep_until >= E(m),
// hence E(m) < p - W <= t - W < t - W + Skew, and the guard expires m: it is
// never applied twice. The same holds for every message seen before the
// prune, whichever of them wrote the marker: that is what the extension
// buys a business key, whose later messages map to an older marker.
//
// What the window cannot cover is a message never seen before whose key's
// marker is gone: a business key is deduplicated for W after the newest
// message that met it, and a first message for it later than that is a new
// effect to the inbox. The seeds call such late messages a case for
// reconciliation; a consumer that cannot afford one keeps W longer than
// the longest gap between messages for one key.
//
// The day-0/13/14.5/15 sequence is the case the extension exists for: day 0
// m1 (invoice:c1:2026-03) is applied; day 13 m2, another message for the
// same invoice, is a Duplicate and raises keep_until to day 13; the prune
// at day 14.5 (cut-off day 0.5) keeps the marker; day 15 the replay of m2
// (event time day 13, inside the horizon) is a Duplicate again. Without the
// extension the prune would have gone by m1's times and m2 applied twice.
//
// A message without an event time cannot be judged by the guard: its
// marker is kept W after it was written, and a replay later than that is
// applied again. Such messages are counted and logged, and a consumer can
// refuse them.
//
// # Partitioned layout: partition time
//
// The partitioned inbox's primary key is (consumer, key, partition_time),
// and whole days are dropped by partition time: a day [d, d+24h) goes only
// when d + 24h <= p - W. The partition time P is a function of the key
// alone (the time inside a UUIDv7 message ID, or a period the business key
// names), never of a timestamp a copy carries, so every copy of a message —
// redelivered, republished with a fresh timestamp, replayed — computes the
// same P and meets the same row. A marker cannot move partition, so it
// cannot be extended the way keep_until is (keep_until is kept, for
// reporting only). Instead the horizon guard also expires a message whose
// P is older than the window. Suppose a drop at p removed the day holding
// the marker of key k, so P(k) < p - W, and a message m with key k comes at
// t >= p. The guard accepts m only if P(k) >= t - W + Skew > p - W:
// contradiction, so m is Expired, never applied twice. This holds for every
// message of key k whatever its event time, which is why the partitioned
// layout needs no extension: a business key's messages all share its
// period's partition time, and the last of them is guarded as long as the
// period is inside the window. The price is that a business key is
// accepted only while its period is inside the window; choose the period's
// end as its partition time and a window longer than the period.
package retention

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
)

// ErrShortWindow is wrapped by the error of a prune or a partition drop
// asked for a window shorter than the one stored with the inbox table:
// consumers accept messages that old, so their markers must stay.
var ErrShortWindow = errors.New("window shorter than the one stored with the inbox")

// DefaultWindow is the retention window when none is configured: 14 days,
// longer than Kafka's default topic retention (7 days), so an offset reset
// to the earliest retained record still finds every marker.
const DefaultWindow = 14 * 24 * time.Hour

// DefaultBatchSize is how many markers one prune transaction deletes when
// Options.BatchSize is 0.
const DefaultBatchSize = 5000

// Options configure one prune run.
type Options struct {
	// Window is how long markers are kept. 0 means the store's window
	// (DefaultWindow unless configured). It must be at least the consumers'
	// Horizon.Window, or a message the guard accepts may find its marker gone.
	Window time.Duration
	// BatchSize bounds the markers one transaction deletes, so that no
	// transaction holds many row locks or runs long. Defaults to 5,000.
	BatchSize int
	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool
	// Hooks receive the count of pruned markers ([PruneHook]). Optional; a
	// store's own hooks are used when empty.
	Hooks []idem.Hook
	// Summaries configures the summaries of pruned keys the prune keeps.
	Summaries SummaryOptions
}

// SummaryOptions configure the summaries a prune keeps of the keys it
// deleted: about one Bloom filter per consumer and day (a day's prunes grow
// the day's filter; a dropped partition gets its own), stored beside the
// inbox, loaded by every processor of that consumer and checked in memory
// for each fresh key (idem.Config.RefuseLate). A hit is a probable late
// duplicate: a replay older than the window, or an untimed message come
// back after its marker went, which no inbox can otherwise tell from a new
// message.
//
// Memory: a summary takes 28.8 bits per key at 1e-6 (3.4 MiB per million
// pruned keys; 1.7 MiB at 1e-3), in the database and in every consumer
// process that loads it; checking a key costs about 80 ns per summary kept.
// A consumer pruning a million markers a day, with summaries kept 30 days,
// holds about 100 MiB of them.
type SummaryOptions struct {
	// FalsePositiveRate is the share of keys never pruned that a summary
	// still calls pruned. Defaults to 1e-6: at a million messages a day,
	// one new message in about three years is taken for a late duplicate
	// (refused only with RefuseLate, and then redrivable).
	FalsePositiveRate float64
	// Keep is how long a summary is kept after its prune: a late duplicate
	// is recognised up to Keep past the window. Defaults to 30 days. -1
	// keeps no summaries.
	Keep time.Duration
}

// WithDefaults returns o with its zero fields set.
func (o SummaryOptions) WithDefaults() SummaryOptions {
	if o.FalsePositiveRate == 0 {
		o.FalsePositiveRate = DefaultSummaryRate
	}
	if o.Keep == 0 {
		o.Keep = DefaultSummaryKeep
	}
	return o
}

// DefaultSummaryRate and DefaultSummaryKeep are SummaryOptions' defaults.
const (
	DefaultSummaryRate = 1e-6
	DefaultSummaryKeep = 30 * 24 * time.Hour
)

// WithDefaults returns o with its zero fields set: window is the store's.
func (o Options) WithDefaults(window time.Duration) Options {
	if o.Window == 0 {
		o.Window = window
	}
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	o.Summaries = o.Summaries.WithDefaults()
	return o
}

// Validate reports an unusable option.
func (o Options) Validate() error {
	if r := o.Summaries.FalsePositiveRate; r < 1e-15 || r > 0.5 {
		return fmt.Errorf("summary false-positive rate %v must be between 1e-15 and 0.5", r)
	}
	if o.Summaries.Keep < -1 {
		return fmt.Errorf("summary keep %v must be positive or -1", o.Summaries.Keep)
	}
	if o.Window <= 0 {
		return fmt.Errorf("prune window %v must be positive", o.Window)
	}
	if o.BatchSize < 1 {
		return fmt.Errorf("prune batch size %d must be at least 1", o.BatchSize)
	}
	return nil
}

// Result is what a prune did.
type Result struct {
	// Cutoff is the time markers had to be older than to go (database clock).
	Cutoff time.Time
	// Markers is the number of markers deleted, or that would be with DryRun.
	Markers int64
	// Batches is the number of delete transactions run.
	Batches int
	// Partitions lists the partitions dropped (or that would be with DryRun)
	// by a partitioned inbox's prune.
	Partitions []string
	// Summaries counts the pruned-key summaries written (one per consumer
	// that lost markers).
	Summaries int
	// Skipped is set when another instance held the prune lock: this run did
	// nothing, which is not an error.
	Skipped bool
	// DryRun echoes Options.DryRun.
	DryRun bool
}

// The retention hooks go in a store's Config.Hooks (or Options.Hooks), an
// [idem.Hook] list like the processor's: any value implementing one or more
// of the interfaces below (package idemprom's Metrics implements them all).
// They are called inline: they must be safe for concurrent use and fast.
// Messages refused as too old are not reported here: the processor's
// idem.OutcomeHook sees them with outcome Expired.

// PruneHook receives the markers deleted from table by one prune run.
type PruneHook interface {
	OnPrune(table string, n int64)
}

// DropHook receives the partitions of table dropped by one run.
type DropHook interface {
	OnDrop(table string, n int)
}

// OldestHook receives the age of table's oldest marker (by the later of
// its event time and write time), each time a store's stats are read.
type OldestHook interface {
	OnOldest(table string, age time.Duration)
}

// Stats describes an inbox table for operators.
type Stats struct {
	Table string
	// Rows is the number of markers.
	Rows int64
	// NoEventTime counts markers without an event time (the guard could not
	// judge their messages; they are kept a Window after they were written).
	NoEventTime int64
	// Oldest is the retention time of the oldest marker: the later of its
	// event time and its write time. Zero when the table is empty.
	Oldest time.Time
	// OldestAge is Now minus Oldest.
	OldestAge time.Duration
	// Window is the retention window the stats were computed for.
	Window time.Duration
	// Headroom is Window minus OldestAge: how long until the oldest marker
	// may be pruned. Negative means markers past the window are waiting for a
	// prune (the prune is late by that much).
	Headroom time.Duration
	// Prunable counts markers a prune would delete now.
	Prunable int64
	// Partitions lists the inbox's daily partitions, oldest first (partitioned
	// layout only).
	Partitions []string
	// Now is the database's clock when the stats were read.
	Now time.Time
}

// RecordedHorizon is the horizon a consumer of an inbox last reported
// (idemstore.Store.RecordHorizon): the window it guards with, and when.
type RecordedHorizon struct {
	Consumer string
	Window   time.Duration
	SeenAt   time.Time
}

// Finish fills the derived fields from Now, Oldest and Window.
func (s *Stats) Finish() {
	if s.Oldest.IsZero() {
		s.OldestAge, s.Headroom = 0, s.Window
		return
	}
	s.OldestAge = s.Now.Sub(s.Oldest)
	s.Headroom = s.Window - s.OldestAge
}
