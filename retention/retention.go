// Package retention is what the inbox stores share about forgetting markers
// safely: the options and result of a prune, the metrics hooks, and the
// invariant that makes forgetting safe. The prune SQL of every dialect lives
// with the rest of the inbox SQL, in package internal/inboxdb.
//
// # The invariant
//
// A marker is never removed while a message that maps to it can still be
// accepted. The processor's horizon guard ([idem.Horizon]) accepts a message
// at time t only if its event time E satisfies
//
//	E >= t - (Window - Skew)
//
// and a prune running at time p removes a marker only if
//
//	greatest(E, processed_at) < p - Window
//
// Every delivery of a message carries the same event time E as the marker it
// claimed, so once a prune at p removed the marker, any later delivery (t >= p)
// has E < p - Window <= t - Window + Skew and is Expired, never applied
// again. The Skew (5 minutes by default) absorbs what separates the two
// clocks: the consumer host's clock running behind the database's, and the
// time a message spends between the guard and its claim (retries, lock
// waits). Both must stay below Skew.
//
// Pruning on the later of the event time and the write time is stricter than
// the guard needs, on purpose: a marker also lives a whole Window after it was
// written, which covers markers with no event time (the guard cannot judge
// those messages) and business keys, where a later message with a newer event
// time maps to an older marker.
package retention

import (
	"errors"
	"fmt"
	"time"
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
	// Hooks receives the count of pruned markers. Optional; a store's own
	// hooks are used when nil.
	Hooks Hooks
}

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
	return o
}

// Validate reports an unusable option.
func (o Options) Validate() error {
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
	// Skipped is set when another instance held the prune lock: this run did
	// nothing, which is not an error.
	Skipped bool
	// DryRun echoes Options.DryRun.
	DryRun bool
}

// Hooks receives retention metrics. Implementations must be safe for
// concurrent use and fast; they are called inline. Messages refused as too
// old are not reported here: the processor's idem.Observer sees them with
// outcome Expired.
type Hooks interface {
	// MarkersPruned reports markers deleted from table by one prune run.
	MarkersPruned(table string, n int64)
	// PartitionsDropped reports partitions of table dropped by one run.
	PartitionsDropped(table string, n int)
	// OldestMarker reports the age of table's oldest marker (by the later of
	// its event time and write time), each time a store's stats are read.
	OldestMarker(table string, age time.Duration)
}

// NopHooks ignores everything; embed it to implement only some hooks.
type NopHooks struct{}

// MarkersPruned does nothing.
func (NopHooks) MarkersPruned(string, int64) {}

// PartitionsDropped does nothing.
func (NopHooks) PartitionsDropped(string, int) {}

// OldestMarker does nothing.
func (NopHooks) OldestMarker(string, time.Duration) {}

// Or returns h, else fallback, else NopHooks: the first hooks configured.
func Or(h Hooks, fallback Hooks) Hooks {
	if h != nil {
		return h
	}
	if fallback != nil {
		return fallback
	}
	return NopHooks{}
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

// Finish fills the derived fields from Now, Oldest and Window.
func (s *Stats) Finish() {
	if s.Oldest.IsZero() {
		s.OldestAge, s.Headroom = 0, s.Window
		return
	}
	s.OldestAge = s.Now.Sub(s.Oldest)
	s.Headroom = s.Window - s.OldestAge
}
