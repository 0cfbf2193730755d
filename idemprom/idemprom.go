// Package idemprom exports idem's metrics to Prometheus. The core package
// never imports Prometheus; wire this observer in to get:
//
//	idem_messages_total{consumer,outcome}   every result, by outcome
//	idem_process_seconds{consumer}          time of the transaction that carried it
//	idem_key_conflicts_total{consumer}      duplicates whose body differed from the winner's
//	idem_redelivered_total{consumer}        deliveries the broker flagged as redelivered
//	idem_inbox_markers_pruned_total{table}  markers removed by prune
//	idem_inbox_partitions_dropped_total{table}
//	idem_inbox_oldest_marker_age_seconds{table}  read by stats; against the window it shows prune falling behind
//
// Metrics also implements retention.Hooks: pass it as pgxinbox.Config.Hooks
// (or PruneOptions.Hooks). Expired messages are counted by
// idem_messages_total{outcome="expired"}.
//
// Usage:
//
//	m := idemprom.New(prometheus.DefaultRegisterer)
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{..., Observer: m})
//
// idem_redelivered_total is fed by a broker adapter's hooks; for RabbitMQ
// (Kafka has no redelivered flag), a three-line adapter keeps this package
// free of broker clients:
//
//	type hooks struct {
//		idemrabbitmq.NopHooks
//		m *idemprom.Metrics
//	}
//
//	func (h hooks) Redelivered(queue string) { h.m.Redelivered(queue) }
package idemprom

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem"
)

// Metrics is an idem.Observer that records to Prometheus. One Metrics can
// serve every processor of a process: series are labelled by consumer.
type Metrics struct {
	messages    *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
	conflicts   *prometheus.CounterVec
	redelivered *prometheus.CounterVec
	pruned      *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	oldest      *prometheus.GaugeVec
}

// New creates the metrics and registers them with reg (nil: not
// registered, for callers that register the collectors themselves). A
// registerer that already holds idem's collectors is reused rather than
// failing, so two components may each call New.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_messages_total",
			Help: "Messages processed, by consumer and outcome (applied, duplicate, retry, dead_lettered, expired).",
		}, []string{"consumer", "outcome"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_process_seconds",
			Help:    "Time of the transaction (or batch) that processed a message.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"consumer"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_key_conflicts_total",
			Help: "Duplicates whose body hash differed from the message that won the key: usually a producer reusing IDs.",
		}, []string{"consumer"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_redelivered_total",
			Help: "Deliveries flagged by the broker as redelivered (informative; the inbox decides).",
		}, []string{"consumer"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_inbox_markers_pruned_total",
			Help: "Inbox markers removed by prune, by table.",
		}, []string{"table"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_inbox_partitions_dropped_total",
			Help: "Inbox partitions dropped, by table.",
		}, []string{"table"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idem_inbox_oldest_marker_age_seconds",
			Help: "Age of the oldest inbox marker when stats were last read; above the retention window means prune is late.",
		}, []string{"table"}),
	}
	if reg != nil {
		m.pruned = register(reg, m.pruned)
		m.dropped = register(reg, m.dropped)
		m.oldest = register(reg, m.oldest)
		m.messages = register(reg, m.messages)
		m.seconds = register(reg, m.seconds)
		m.conflicts = register(reg, m.conflicts)
		m.redelivered = register(reg, m.redelivered)
	}
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}

// Observe implements idem.Observer.
func (m *Metrics) Observe(consumer string, r idem.Result, elapsed time.Duration) {
	m.messages.WithLabelValues(consumer, r.Outcome.String()).Inc()
	m.seconds.WithLabelValues(consumer).Observe(elapsed.Seconds())
	if r.Conflict {
		m.conflicts.WithLabelValues(consumer).Inc()
	}
}

// Redelivered counts one delivery the broker flagged as redelivered. Broker
// adapters call it through their hooks.
func (m *Metrics) Redelivered(consumer string) {
	m.redelivered.WithLabelValues(consumer).Inc()
}

// MessagesCounter returns idem_messages_total, for tests and dashboards
// built in code.
func (m *Metrics) MessagesCounter() *prometheus.CounterVec { return m.messages }

// MarkersPruned implements retention.Hooks.
func (m *Metrics) MarkersPruned(table string, n int64) {
	m.pruned.WithLabelValues(table).Add(float64(n))
}

// PartitionsDropped implements retention.Hooks.
func (m *Metrics) PartitionsDropped(table string, n int) {
	m.dropped.WithLabelValues(table).Add(float64(n))
}

// OldestMarker implements retention.Hooks.
func (m *Metrics) OldestMarker(table string, age time.Duration) {
	m.oldest.WithLabelValues(table).Set(age.Seconds())
}

// PrunedCounter returns idem_inbox_markers_pruned_total, for tests.
func (m *Metrics) PrunedCounter() *prometheus.CounterVec { return m.pruned }
