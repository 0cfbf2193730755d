package idemprom

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/internal/inboxdb"
)

// InboxStats is what an [InboxCollector] reads: pgxinbox.Store and
// sqlinbox.Store implement it (their ConsumerStats types are this one).
type InboxStats interface {
	// ConsumerStats reads each consumer's oldest marker; cheap (indexes).
	ConsumerStats(ctx context.Context) (inboxdb.ConsumerStats, error)
	// ConsumerMarkers counts each consumer's markers; a pass over the table.
	ConsumerMarkers(ctx context.Context) (map[string]int64, error)
}

// InboxOptions configure an [InboxCollector]. The zero value is usable.
type InboxOptions struct {
	// Interval is how long one read of the oldest markers serves scrapes:
	// a scrape within Interval of the last read (successful or not)
	// answers from it. Defaults to 30 seconds; negative: every scrape
	// reads.
	Interval time.Duration
	// Timeout bounds that read, and so how long a scrape can wait for the
	// database: one that does not answer gives idem_inbox_stats_up 0 and
	// one more idem_inbox_scrape_errors_total{read="oldest"}. Keep it
	// under the scrape timeout of Prometheus (10 s by default). Defaults
	// to 5 seconds.
	Timeout time.Duration
	// CountInterval is how often the markers are counted, a pass over the
	// table: in the background, started by a scrape, so that no scrape
	// waits for it (scrapes export the last count). Defaults to 5 minutes;
	// negative: never (no idem_inbox_consumer_markers).
	CountInterval time.Duration
	// CountTimeout bounds one count. Defaults to 1 minute.
	CountTimeout time.Duration
}

// Defaults of InboxOptions.
const (
	DefaultInboxInterval      = 30 * time.Second
	DefaultInboxTimeout       = 5 * time.Second
	DefaultInboxCountInterval = 5 * time.Minute
	DefaultInboxCountTimeout  = time.Minute
)

// InboxCollector is a prometheus.Collector that reads an inbox's
// per-consumer figures on scrape, at most once per Interval (the counts
// once per CountInterval, in the background), and exports:
//
//	idem_inbox_consumer_oldest_marker_age_seconds{table,consumer}  age of the consumer's oldest marker (its keep_until)
//	idem_inbox_consumer_headroom_seconds{table,consumer}           window minus that age: well below zero, prune is not keeping up
//	idem_inbox_consumer_markers{table,consumer}                    markers held, as last counted
//	idem_inbox_window_seconds{table}                               the retention window stored with the table
//	idem_inbox_stats_up{table}                                     1 when the last read of the oldest markers succeeded, 0 when it failed
//	idem_inbox_stats_read_seconds{table,read}                      how long the last read (oldest, markers) took
//	idem_inbox_scrape_errors_total{table,read}                     reads that failed or timed out
//
// After a failed read the series it feeds are absent (not their last
// values: an alert must not rest on figures nobody could read) until a
// read succeeds again; idem_inbox_stats_up and the error counter say so.
type InboxCollector struct {
	store InboxStats
	table string
	opts  InboxOptions

	age, headroom, markers, window, up, took, errs *prometheus.Desc

	oldest *cachedRead[inboxdb.ConsumerStats]

	mu          sync.Mutex
	counts      countRead
	countAt     time.Time // when the last count started; zero: never
	counting    bool
	countErrors float64
}

type countRead struct {
	markers map[string]int64 // nil: none yet, or the last count failed
	took    time.Duration
}

// Reads, the values of the read label.
const (
	readOldest  = "oldest"
	readMarkers = "markers"
)

// NewInboxCollector returns a collector of store's per-consumer figures,
// labelled table (the inbox table's name, as its retention metrics are;
// "" means "idem_inbox"). Register it:
//
//	reg.MustRegister(idemprom.NewInboxCollector(store, "idem_inbox", nil))
//
// One collector per inbox table, in one process (the figures cover every
// consumer of the table): several instances exporting the same table only
// multiply the reads.
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
	if o.CountInterval == 0 {
		o.CountInterval = DefaultInboxCountInterval
	}
	if o.CountTimeout <= 0 {
		o.CountTimeout = DefaultInboxCountTimeout
	}
	tl := prometheus.Labels{"table": table}
	cl := []string{"consumer"}
	return &InboxCollector{
		store: store, table: table, opts: o,
		oldest: &cachedRead[inboxdb.ConsumerStats]{read: store.ConsumerStats, interval: o.Interval, timeout: o.Timeout},
		age: prometheus.NewDesc("idem_inbox_consumer_oldest_marker_age_seconds",
			"Age of the consumer's oldest inbox marker (its keep_until, or partition time); well above the window means prune is not running.", cl, tl),
		headroom: prometheus.NewDesc("idem_inbox_consumer_headroom_seconds",
			"Retention window minus the age of the consumer's oldest marker: near zero on a table the prune keeps trim, well below zero when prune is late or stopped.", cl, tl),
		markers: prometheus.NewDesc("idem_inbox_consumer_markers",
			"Inbox markers held by the consumer, as last counted.", cl, tl),
		window: prometheus.NewDesc("idem_inbox_window_seconds",
			"Retention window stored with the inbox table.", nil, tl),
		up: prometheus.NewDesc("idem_inbox_stats_up",
			"1 when the last read of the inbox's oldest markers succeeded, 0 when it failed or timed out.", nil, tl),
		took: prometheus.NewDesc("idem_inbox_stats_read_seconds",
			"Time the last read of the inbox's per-consumer figures took, by read (oldest, markers).", []string{"read"}, tl),
		errs: prometheus.NewDesc("idem_inbox_scrape_errors_total",
			"Reads of the inbox's per-consumer figures that failed or timed out, by read (oldest, markers).", []string{"read"}, tl),
	}
}

// Describe implements prometheus.Collector.
func (c *InboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.age, c.headroom, c.markers, c.window, c.up, c.took, c.errs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It reads the oldest markers
// when the last read is older than Interval, waiting for that read at most
// Timeout, and starts a count in the background when the last one is
// older than CountInterval.
func (c *InboxCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.oldest.get()
	c.mu.Lock()
	c.maybeCount()
	counts := c.counts
	errs := map[string]float64{readOldest: c.oldest.failures(), readMarkers: c.countErrors}
	c.mu.Unlock()

	for _, read := range []string{readOldest, readMarkers} {
		ch <- prometheus.MustNewConstMetric(c.errs, prometheus.CounterValue, errs[read], read)
	}
	ch <- prometheus.MustNewConstMetric(c.took, prometheus.GaugeValue, r.took.Seconds(), readOldest)
	if c.opts.CountInterval > 0 {
		ch <- prometheus.MustNewConstMetric(c.took, prometheus.GaugeValue, counts.took.Seconds(), readMarkers)
	}
	for consumer, n := range counts.markers {
		ch <- prometheus.MustNewConstMetric(c.markers, prometheus.GaugeValue, float64(n), consumer)
	}
	if r.err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.window, prometheus.GaugeValue, r.val.Window.Seconds())
	for _, s := range r.val.Consumers {
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, s.OldestAge.Seconds(), s.Consumer)
		ch <- prometheus.MustNewConstMetric(c.headroom, prometheus.GaugeValue, s.Headroom.Seconds(), s.Consumer)
	}
}

// maybeCount starts a count when one is due and none runs. c.mu is held.
func (c *InboxCollector) maybeCount() {
	if c.opts.CountInterval < 0 || c.counting || (!c.countAt.IsZero() && time.Since(c.countAt) < c.opts.CountInterval) {
		return
	}
	c.counting, c.countAt = true, time.Now()
	go func() { _ = c.count(context.Background()) }()
}

// Count counts the markers now, bounded by ctx and CountTimeout, and
// publishes the result for the following scrapes; scrapes otherwise start
// a count in the background every CountInterval. It returns the count's
// error.
func (c *InboxCollector) Count(ctx context.Context) error {
	c.mu.Lock()
	c.countAt = time.Now()
	c.mu.Unlock()
	return c.count(ctx)
}

func (c *InboxCollector) count(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.CountTimeout)
	defer cancel()
	start := time.Now()
	markers, err := c.store.ConsumerMarkers(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counting = false
	c.counts = countRead{markers: markers, took: time.Since(start)}
	if err != nil {
		c.counts.markers = nil
		c.countErrors++
	}
	return err
}

// Err returns the error of the last read of the oldest markers, nil when
// it succeeded or none ran yet, for a health check or a log line.
func (c *InboxCollector) Err() error { return c.oldest.lastErr() }

var _ prometheus.Collector = (*InboxCollector)(nil)
