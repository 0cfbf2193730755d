package idemprom

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/outbox"
)

// outboxMetrics are the counters the outbox relays feed through Metrics.
type outboxMetrics struct {
	published, refused, parked *prometheus.CounterVec
	outages, outageWait        prometheus.Counter
}

func newOutboxMetrics(reg prometheus.Registerer) outboxMetrics {
	dl := []string{"destination"}
	m := outboxMetrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_outbox_published_total",
			Help: "Outbox records the broker confirmed and a relay marked sent, by destination (Kafka topic or RabbitMQ exchange; empty for the default exchange).",
		}, dl),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_outbox_refused_total",
			Help: "Publish attempts of outbox records the broker refused (unroutable, too large, unknown topic), by destination; each refused record is tried again until it is parked.",
		}, dl),
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_outbox_parked_total",
			Help: "Outbox records parked after the broker refused them RelayConfig.MaxAttempts times, by destination: they wait for idem outbox retry.",
		}, dl),
		outages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_outbox_outages_total",
			Help: "Failures of the outbox relays to reach the broker or the database; each is followed by a backoff wait, nothing is parked.",
		}),
		outageWait: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_outbox_outage_wait_seconds_total",
			Help: "Time the outbox relays spent (or were set to spend) waiting out outages: its rate is the share of relays' time lost to an unreachable broker or database.",
		}),
	}
	if reg != nil {
		m.published = register(reg, m.published)
		m.refused = register(reg, m.refused)
		m.parked = register(reg, m.parked)
		m.outages = register(reg, m.outages)
		m.outageWait = register(reg, m.outageWait)
	}
	return m
}

// OnPublish implements outbox.PublishHook: set Metrics in
// outbox.RelayConfig.Hooks.
func (m *Metrics) OnPublish(destination string, n int) {
	m.outbox.published.WithLabelValues(destination).Add(float64(n))
}

// OnRefuse implements outbox.RefuseHook. Every refusal counts in
// idem_outbox_refused_total, the one that parks the record in
// idem_outbox_parked_total too. The error is logged by the relay, never
// made a label.
func (m *Metrics) OnRefuse(r outbox.Record, _ error, parked bool) {
	m.outbox.refused.WithLabelValues(r.Destination).Inc()
	if parked {
		m.outbox.parked.WithLabelValues(r.Destination).Inc()
	}
}

// OnOutage implements outbox.OutageHook.
func (m *Metrics) OnOutage(_ error, wait time.Duration) {
	m.outbox.outages.Inc()
	m.outbox.outageWait.Add(max(wait, 0).Seconds())
}

var (
	_ outbox.PublishHook = (*Metrics)(nil)
	_ outbox.RefuseHook  = (*Metrics)(nil)
	_ outbox.OutageHook  = (*Metrics)(nil)
)

// OutboxStats is what an [OutboxCollector] reads: *outbox.Outbox of any
// transaction type implements it.
type OutboxStats interface {
	// Stats counts the outbox's rows per destination; a pass over the
	// table.
	Stats(ctx context.Context) (outbox.Stats, error)
}

// OutboxOptions configure an [OutboxCollector]. The zero value is usable.
type OutboxOptions struct {
	// Interval is how long one read of the outbox's figures serves
	// scrapes: a scrape within Interval of the last read (successful or
	// not) answers from it. Each read is a pass over the table, sent rows
	// included until they are pruned. Defaults to 30 seconds; negative:
	// every scrape reads.
	Interval time.Duration
	// Timeout bounds that read, and so how long a scrape can wait for the
	// database: one that does not answer gives idem_outbox_stats_up 0 and
	// one more idem_outbox_scrape_errors_total. Keep it under the scrape
	// timeout of Prometheus (10 s by default). Defaults to 5 seconds.
	Timeout time.Duration
}

// Defaults of OutboxOptions.
const (
	DefaultOutboxInterval = 30 * time.Second
	DefaultOutboxTimeout  = 5 * time.Second
)

// OutboxCollector is a prometheus.Collector that reads an outbox's
// figures on scrape, at most once per Interval and waiting at most
// Timeout, and exports:
//
//	idem_outbox_unsent{table,destination}                      rows committed and not yet confirmed by the broker (parked rows excluded)
//	idem_outbox_oldest_unsent_age_seconds{table,destination}   how long the oldest of them has waited, by the database's clock (0 when none): the relays' lag
//	idem_outbox_parked{table,destination}                      rows parked after the broker refused them, waiting for idem outbox retry
//	idem_outbox_sent{table,destination}                        rows sent and kept until prune
//	idem_outbox_stats_up{table}                                1 when the last read succeeded, 0 when it failed or timed out
//	idem_outbox_stats_read_seconds{table}                      how long the last read took
//	idem_outbox_scrape_errors_total{table}                     reads that failed or timed out
//
// After a failed read the per-destination series are absent (not their
// last values: an alert must not rest on figures nobody could read) until
// a read succeeds again; idem_outbox_stats_up and the error counter say
// so. The relays' own counters (idem_outbox_published_total and the
// others) come from [Metrics] set as their hook.
type OutboxCollector struct {
	table string
	stats *cachedRead[outbox.Stats]

	unsent, age, parked, sent, up, took, errs *prometheus.Desc
}

// NewOutboxCollector returns a collector of an outbox's figures, labelled
// table; "" takes the name from stats when it has a Table method (as
// *outbox.Outbox has), else "idem_outbox". Register it:
//
//	reg.MustRegister(idemprom.NewOutboxCollector(ob, "", nil))
//
// One collector per outbox table, in one process: several instances
// exporting the same table only multiply the reads.
func NewOutboxCollector(stats OutboxStats, table string, opts *OutboxOptions) *OutboxCollector {
	if table == "" {
		if t, ok := stats.(interface{ Table() string }); ok {
			table = t.Table()
		}
	}
	if table == "" {
		table = outbox.DefaultTable
	}
	var o OutboxOptions
	if opts != nil {
		o = *opts
	}
	if o.Interval == 0 {
		o.Interval = DefaultOutboxInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultOutboxTimeout
	}
	tl := prometheus.Labels{"table": table}
	dl := []string{"destination"}
	return &OutboxCollector{
		table: table,
		stats: &cachedRead[outbox.Stats]{read: stats.Stats, interval: o.Interval, timeout: o.Timeout},
		unsent: prometheus.NewDesc("idem_outbox_unsent",
			"Outbox rows committed and not yet confirmed by the broker, by destination (parked rows excluded).", dl, tl),
		age: prometheus.NewDesc("idem_outbox_oldest_unsent_age_seconds",
			"How long the destination's oldest unsent outbox row has waited, by the database's clock; 0 when none is unsent. Growing: the relays are stopped or the broker is unreachable.", dl, tl),
		parked: prometheus.NewDesc("idem_outbox_parked",
			"Outbox rows parked after the broker refused them MaxAttempts times, by destination: they wait for idem outbox retry.", dl, tl),
		sent: prometheus.NewDesc("idem_outbox_sent",
			"Outbox rows sent and kept until prune, by destination.", dl, tl),
		up: prometheus.NewDesc("idem_outbox_stats_up",
			"1 when the last read of the outbox's figures succeeded, 0 when it failed or timed out.", nil, tl),
		took: prometheus.NewDesc("idem_outbox_stats_read_seconds",
			"Time the last read of the outbox's figures took.", nil, tl),
		errs: prometheus.NewDesc("idem_outbox_scrape_errors_total",
			"Reads of the outbox's figures that failed or timed out.", nil, tl),
	}
}

// Describe implements prometheus.Collector.
func (c *OutboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.unsent, c.age, c.parked, c.sent, c.up, c.took, c.errs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It reads the outbox's figures
// when the last read is older than Interval, waiting for that read at
// most Timeout.
func (c *OutboxCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.stats.get()
	ch <- prometheus.MustNewConstMetric(c.errs, prometheus.CounterValue, c.stats.failures())
	ch <- prometheus.MustNewConstMetric(c.took, prometheus.GaugeValue, r.took.Seconds())
	if r.err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	st := r.val
	// The database's clock at the read: Stats gives the oldest row's age
	// by it, the destinations' oldest rows as times.
	now := st.OldestUnsent.Add(st.OldestUnsentAge)
	for _, d := range st.Destinations {
		var age time.Duration
		if !d.OldestUnsent.IsZero() && !st.OldestUnsent.IsZero() {
			age = max(now.Sub(d.OldestUnsent), 0)
		}
		ch <- prometheus.MustNewConstMetric(c.unsent, prometheus.GaugeValue, float64(d.Unsent), d.Destination)
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age.Seconds(), d.Destination)
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(d.Parked), d.Destination)
		ch <- prometheus.MustNewConstMetric(c.sent, prometheus.GaugeValue, float64(d.Sent), d.Destination)
	}
}

// Err returns the error of the last read, nil when it succeeded or none
// ran yet, for a health check or a log line.
func (c *OutboxCollector) Err() error { return c.stats.lastErr() }

var _ prometheus.Collector = (*OutboxCollector)(nil)
