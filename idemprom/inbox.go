package idemprom

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/internal/inboxdb"
)

// InboxStats is what an [InboxCollector] reads: pgxinbox.Store and
// sqlinbox.Store implement it (their ConsumerStats types are this one).
type InboxStats interface {
	ConsumerStats(ctx context.Context) (inboxdb.ConsumerStats, error)
}

// InboxOptions configure an [InboxCollector]. The zero value is usable.
type InboxOptions struct {
	// Interval is how long one read of the database serves scrapes: a
	// scrape within Interval of the last read (successful or not) answers
	// from it. Defaults to 30 seconds; negative: every scrape reads.
	Interval time.Duration
	// Timeout bounds one read, so a scrape answers even when the database
	// does not (with idem_inbox_stats_up 0 and one more
	// idem_inbox_scrape_errors_total). Keep it under the scrape timeout of
	// Prometheus (10 s by default). Defaults to 5 seconds.
	Timeout time.Duration
}

// DefaultInboxInterval and DefaultInboxTimeout are InboxOptions' defaults.
const (
	DefaultInboxInterval = 30 * time.Second
	DefaultInboxTimeout  = 5 * time.Second
)

// InboxCollector is a prometheus.Collector that reads an inbox's
// per-consumer figures on scrape, at most once per Interval, and exports:
//
//	idem_inbox_consumer_markers{table,consumer}                    markers held
//	idem_inbox_consumer_oldest_marker_age_seconds{table,consumer}  age of the oldest marker's retention time
//	idem_inbox_consumer_headroom_seconds{table,consumer}           window minus that age: negative means prune is not keeping up
//	idem_inbox_window_seconds{table}                               the retention window stored with the table
//	idem_inbox_stats_up{table}                                     1 when the last read succeeded, 0 when it failed
//	idem_inbox_stats_read_seconds{table}                           how long the last read took
//	idem_inbox_scrape_errors_total{table}                          reads that failed or timed out
//
// After a failed read the per-consumer series are absent (not their last
// values: an alert must not rest on figures nobody could read) until a
// read succeeds again; idem_inbox_stats_up says so.
type InboxCollector struct {
	store             InboxStats
	table             string
	interval, timeout time.Duration

	markers, age, headroom, window, up, took, errs *prometheus.Desc

	mu       sync.Mutex
	last     inboxRead
	at       time.Time     // when last was read; zero: never
	inflight chan struct{} // closed when the running read ends; nil: none
	errors   float64
}

// inboxRead is one read's outcome.
type inboxRead struct {
	stats inboxdb.ConsumerStats
	err   error
	took  time.Duration
}

// NewInboxCollector returns a collector of store's per-consumer figures,
// labelled table (the inbox table's name, as its retention metrics are;
// "" means "idem_inbox"). Register it:
//
//	reg.MustRegister(idemprom.NewInboxCollector(store, "idem_inbox", nil))
//
// One collector per inbox table: the figures cover every consumer of it.
func NewInboxCollector(store InboxStats, table string, opts *InboxOptions) *InboxCollector {
	if table == "" {
		table = "idem_inbox"
	}
	var o InboxOptions
	if opts != nil {
		o = *opts
	}
	if o.Interval == 0 {
		o.Interval = DefaultInboxInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultInboxTimeout
	}
	tl := prometheus.Labels{"table": table}
	cl := []string{"consumer"}
	return &InboxCollector{
		store: store, table: table, interval: o.Interval, timeout: o.Timeout,
		markers: prometheus.NewDesc("idem_inbox_consumer_markers",
			"Inbox markers held by the consumer.", cl, tl),
		age: prometheus.NewDesc("idem_inbox_consumer_oldest_marker_age_seconds",
			"Age of the consumer's oldest inbox marker (its keep_until, or partition time); above the window means prune is not running.", cl, tl),
		headroom: prometheus.NewDesc("idem_inbox_consumer_headroom_seconds",
			"Retention window minus the age of the consumer's oldest marker: how long until it may be pruned. Low or negative: prune is late or stopped, or the window is too short.", cl, tl),
		window: prometheus.NewDesc("idem_inbox_window_seconds",
			"Retention window stored with the inbox table.", nil, tl),
		up: prometheus.NewDesc("idem_inbox_stats_up",
			"1 when the last read of the inbox's per-consumer figures succeeded, 0 when it failed or timed out.", nil, tl),
		took: prometheus.NewDesc("idem_inbox_stats_read_seconds",
			"Time the last read of the inbox's per-consumer figures took.", nil, tl),
		errs: prometheus.NewDesc("idem_inbox_scrape_errors_total",
			"Reads of the inbox's per-consumer figures that failed or timed out.", nil, tl),
	}
}

// Describe implements prometheus.Collector.
func (c *InboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.markers, c.age, c.headroom, c.window, c.up, c.took, c.errs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It reads the database when the
// last read is older than Interval, and waits for that read at most
// Timeout.
func (c *InboxCollector) Collect(ch chan<- prometheus.Metric) {
	r, errs := c.read()
	ch <- prometheus.MustNewConstMetric(c.errs, prometheus.CounterValue, errs)
	ch <- prometheus.MustNewConstMetric(c.took, prometheus.GaugeValue, r.took.Seconds())
	if r.err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.window, prometheus.GaugeValue, r.stats.Window.Seconds())
	for _, s := range r.stats.Consumers {
		ch <- prometheus.MustNewConstMetric(c.markers, prometheus.GaugeValue, float64(s.Markers), s.Consumer)
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, s.OldestAge.Seconds(), s.Consumer)
		ch <- prometheus.MustNewConstMetric(c.headroom, prometheus.GaugeValue, s.Headroom.Seconds(), s.Consumer)
	}
}

// errReadTimeout is the result of a scrape that stopped waiting for a read
// that outlived its timeout (a store that does not honour its context).
var errReadTimeout = errors.New("reading per-consumer inbox stats: timed out")

// read returns the current figures and the error count, reading the store
// when they are stale. Concurrent scrapes share one read.
func (c *InboxCollector) read() (inboxRead, float64) {
	c.mu.Lock()
	if !c.at.IsZero() && c.interval > 0 && time.Since(c.at) < c.interval {
		defer c.mu.Unlock()
		return c.last, c.errors
	}
	if c.inflight == nil {
		c.inflight = make(chan struct{})
		go c.refresh(c.inflight)
	}
	done := c.inflight
	c.mu.Unlock()

	// The read itself is bounded by Timeout; this bound only matters for a
	// store that ignores its context, which must not hold the scrape.
	t := time.NewTimer(c.timeout + time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.mu.Lock()
		defer c.mu.Unlock()
		return inboxRead{err: errReadTimeout, took: c.timeout}, c.errors
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.errors
}

// refresh reads the store once, with the timeout, and publishes the result.
func (c *InboxCollector) refresh(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	start := time.Now()
	st, err := c.store.ConsumerStats(ctx)
	r := inboxRead{stats: st, err: err, took: time.Since(start)}
	c.mu.Lock()
	c.last, c.at, c.inflight = r, time.Now(), nil
	if err != nil {
		c.errors++
	}
	c.mu.Unlock()
	close(done)
}

// Err returns the error of the last read, nil when it succeeded or none
// ran yet, for a health check or a log line of the caller's.
func (c *InboxCollector) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.err
}

var _ prometheus.Collector = (*InboxCollector)(nil)
