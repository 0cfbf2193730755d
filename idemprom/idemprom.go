// Package idemprom exports idem's metrics to Prometheus. The core package
// never imports Prometheus; Metrics implements every idem hook (and the
// retention hooks), so one value wired in gives:
//
//	idem_messages_total{consumer,outcome}   every result, by outcome
//	idem_process_seconds{consumer}          time of the transaction that carried it
//	idem_key_conflicts_total{consumer}      duplicates whose body differed from the winner's
//	idem_untimed_total{consumer,outcome}    messages with no usable event time (no guard past the window): applied, or dead_lettered when refused
//	idem_duplicate_age_seconds{consumer}    how old the marker a duplicate met was: seconds for a redelivery, days for a replay
//	idem_late_duplicates_total{consumer,outcome}  messages whose key a prune had deleted: applied (probably twice) or expired (refused)
//	idem_attempts_failed_total{consumer,class,batch}  failed tries, by error class (transient, permanent, unavailable, config, busy)
//	idem_settled_total{consumer,action}     what the adapters told the broker (ack, redeliver, hold, dead_letter)
//	idem_dead_letters_total{consumer,result,reason}  dead letters written (ok) or refused by their destination (error), by [Reason]
//	idem_redelivered_total{consumer}        deliveries the broker flagged as redelivered
//	idem_inbox_markers_pruned_total{table}  markers removed by prune
//	idem_inbox_partitions_dropped_total{table}
//	idem_inbox_oldest_marker_age_seconds{table}  read by stats; against the window it shows prune falling behind
//
// [InboxCollector] adds the per-consumer figures of an inbox table, read
// from the database on scrape (cached, bounded by a deadline):
//
//	idem_inbox_consumer_oldest_marker_age_seconds{table,consumer}
//	idem_inbox_consumer_headroom_seconds{table,consumer}  window minus that age
//	idem_inbox_consumer_markers{table,consumer}           counted in the background
//	idem_inbox_window_seconds{table}
//	idem_inbox_stats_up{table}, idem_inbox_stats_read_seconds{table,read}, idem_inbox_scrape_errors_total{table,read}
//
// Metrics is also an outbox relay hook (set it in outbox.RelayConfig.Hooks):
//
//	idem_outbox_published_total{destination}  records confirmed by the broker and marked sent
//	idem_outbox_refused_total{destination}    publish attempts the broker refused
//	idem_outbox_parked_total{destination}     records parked after their last refused attempt
//	idem_outbox_outages_total, idem_outbox_outage_wait_seconds_total  broker or database unreachable, and the backoff waited
//
// [OutboxCollector] reads an outbox table's figures on scrape, the same way:
//
//	idem_outbox_unsent{table,destination}, idem_outbox_oldest_unsent_age_seconds{table,destination}
//	idem_outbox_parked{table,destination}, idem_outbox_sent{table,destination}
//	idem_outbox_stats_up{table}, idem_outbox_stats_read_seconds{table}, idem_outbox_scrape_errors_total{table}
//
// Alert rules and a Grafana dashboard that use exactly these names ship in
// the repository's deploy/ directory (deploy/prometheus/idem-alerts.yml,
// deploy/grafana/idem-dashboard.json).
//
// Usage:
//
//	m := idemprom.New(prometheus.DefaultRegisterer)
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{..., Hooks: []idem.Hook{m}})
//	store, err := pgxinbox.New(pool, &pgxinbox.Config{Hooks: []idem.Hook{m}})
//	prometheus.MustRegister(idemprom.NewInboxCollector(store, "idem_inbox", nil))
//	relay, err := outbox.NewRelay(ob, pub, &outbox.RelayConfig{Hooks: []idem.Hook{m}})
//	prometheus.MustRegister(idemprom.NewOutboxCollector(ob, "", nil))
//
// The broker adapters take the processor's hooks, so settlements, dead
// letters and redeliveries reach the same Metrics. Expired messages are
// counted by idem_messages_total{outcome="expired"}.
package idemprom

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemstore"
)

// Metrics records to Prometheus what the processor and the broker adapters
// report: it implements the processor's hooks (idem.OutcomeHook,
// idem.AttemptHook) and the broker hooks (idembroker.SettleHook,
// DeadLetterHook, RedeliveredHook), so it goes in idem.Config.Hooks. One
// Metrics can serve every processor of a process: series are labelled by
// consumer.
type Metrics struct {
	messages    *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
	conflicts   *prometheus.CounterVec
	redelivered *prometheus.CounterVec
	untimed     *prometheus.CounterVec
	dupAge      *prometheus.HistogramVec
	late        *prometheus.CounterVec
	attempts    *prometheus.CounterVec
	settled     *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	pruned      *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	oldest      *prometheus.GaugeVec
	paused      *prometheus.GaugeVec
	pausedSince *prometheus.GaugeVec
	outbox      outboxMetrics
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
		untimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_untimed_total",
			Help: "Messages with no usable event time, by outcome (dead_lettered: refused by Config.RefuseUntimed): their markers are kept a window after they were written, and a replay after that is not recognised.",
		}, []string{"consumer", "outcome"}),
		dupAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_duplicate_age_seconds",
			Help:    "Age of the marker a duplicate met (now minus when the marker was written): seconds to minutes for a redelivery, hours to days for a replay or a republish.",
			Buckets: DuplicateAgeBuckets,
		}, []string{"consumer"}),
		late: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_late_duplicates_total",
			Help: "Messages whose key was among the markers a prune deleted: probable late duplicates, applied again or refused (Config.RefuseLate).",
		}, []string{"consumer", "outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_attempts_failed_total",
			Help: "Failed transaction tries, by error class (transient, permanent, unavailable, config, busy) and whether the try carried a batch.",
		}, []string{"consumer", "class", "batch"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_settled_total",
			Help: "Deliveries settled with the broker, by action (ack, redeliver, hold, dead_letter).",
		}, []string{"consumer", "action"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_dead_letters_total",
			Help: "Dead letters written to their destination (result ok) or refused by it (result error; the message comes again), by reason (no_message_id, bad_key, bad_time, untimed, no_partition_time, expired, pruned, retries_exhausted, permanent, other).",
		}, []string{"consumer", "result", "reason"}),
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
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idem_consumer_paused",
			Help: "1 while an operator has paused the consumer (idem consumer pause): its messages are held, unapplied, until it is resumed; 0 once resumed.",
		}, []string{"consumer"}),
		pausedSince: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idem_consumer_paused_since_timestamp_seconds",
			Help: "When the consumer was paused, as a Unix time; 0 when it is not paused.",
		}, []string{"consumer"}),
	}
	if reg != nil {
		m.paused = register(reg, m.paused)
		m.pausedSince = register(reg, m.pausedSince)
		m.pruned = register(reg, m.pruned)
		m.dropped = register(reg, m.dropped)
		m.oldest = register(reg, m.oldest)
		m.messages = register(reg, m.messages)
		m.seconds = register(reg, m.seconds)
		m.conflicts = register(reg, m.conflicts)
		m.redelivered = register(reg, m.redelivered)
		m.untimed = register(reg, m.untimed)
		m.dupAge = register(reg, m.dupAge)
		m.late = register(reg, m.late)
		m.attempts = register(reg, m.attempts)
		m.settled = register(reg, m.settled)
		m.deadLetters = register(reg, m.deadLetters)
	}
	m.outbox = newOutboxMetrics(reg)
	return m
}

// DuplicateAgeBuckets are the buckets of idem_duplicate_age_seconds: 1 s,
// 10 s, 1 min, 10 min, 1 h, 6 h, 1 day, 3, 7, 14 and 30 days. The first
// ones hold redeliveries (a restart, a rebalance, a nack), the last ones
// replays (an offset reset, a DLQ re-drive, a producer republishing); a
// duplicate in the last buckets is close to the window, past which it
// would not have been recognised.
var DuplicateAgeBuckets = []float64{1, 10, 60, 600, 3600, 6 * 3600, 86400, 3 * 86400, 7 * 86400, 14 * 86400, 30 * 86400}

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

// OnPause implements idem.PauseHook.
func (m *Metrics) OnPause(consumer string, p idemstore.Pause) {
	if !p.Paused {
		m.paused.WithLabelValues(consumer).Set(0)
		m.pausedSince.WithLabelValues(consumer).Set(0)
		return
	}
	m.paused.WithLabelValues(consumer).Set(1)
	m.pausedSince.WithLabelValues(consumer).Set(float64(p.Since.UnixNano()) / 1e9)
}

// OnOutcome implements idem.OutcomeHook.
func (m *Metrics) OnOutcome(consumer string, r idem.Result, elapsed time.Duration) {
	m.messages.WithLabelValues(consumer, r.Outcome.String()).Inc()
	m.seconds.WithLabelValues(consumer).Observe(elapsed.Seconds())
	if r.Conflict {
		m.conflicts.WithLabelValues(consumer).Inc()
	}
	if r.Untimed {
		m.untimed.WithLabelValues(consumer, r.Outcome.String()).Inc()
	}
	if r.Outcome == idem.Duplicate && r.First != nil {
		// A key repeated inside one batch meets a marker not yet written:
		// its age is zero, as close as a redelivery gets.
		var age time.Duration
		if !r.First.ProcessedAt.IsZero() {
			age = max(time.Since(r.First.ProcessedAt), 0)
		}
		m.dupAge.WithLabelValues(consumer).Observe(age.Seconds())
	}
	if !r.PrunedOn.IsZero() {
		m.late.WithLabelValues(consumer, r.Outcome.String()).Inc()
	}
}

var classNames = map[idemstore.ErrorClass]string{
	idemstore.ClassTransient: "transient", idemstore.ClassPermanent: "permanent",
	idemstore.ClassUnavailable: "unavailable", idemstore.ClassConfig: "config", idemstore.ClassBusy: "busy",
}

// OnAttempt implements idem.AttemptHook.
func (m *Metrics) OnAttempt(consumer string, a idem.Attempt) {
	batch := "false"
	if a.Batch {
		batch = "true"
	}
	m.attempts.WithLabelValues(consumer, classNames[a.Class], batch).Inc()
}

// OnSettle implements idembroker.SettleHook.
func (m *Metrics) OnSettle(consumer, _ string, d idem.Disposition, _ idem.Result) {
	m.settled.WithLabelValues(consumer, d.Action.String()).Inc()
}

// OnDeadLetter implements idembroker.DeadLetterHook. The reason label is
// [Reason] of the result.
func (m *Metrics) OnDeadLetter(consumer, _ string, r idem.Result, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.deadLetters.WithLabelValues(consumer, result, Reason(r)).Inc()
}

// OnRedelivered implements idembroker.RedeliveredHook.
func (m *Metrics) OnRedelivered(consumer, _ string) {
	m.redelivered.WithLabelValues(consumer).Inc()
}

// Redelivered counts one delivery the broker flagged as redelivered.
func (m *Metrics) Redelivered(consumer string) { m.OnRedelivered(consumer, "") }

// MessagesCounter returns idem_messages_total, for tests and dashboards
// built in code.
func (m *Metrics) MessagesCounter() *prometheus.CounterVec { return m.messages }

// OnPrune implements retention.PruneHook.
func (m *Metrics) OnPrune(table string, n int64) {
	m.pruned.WithLabelValues(table).Add(float64(n))
}

// OnDrop implements retention.DropHook.
func (m *Metrics) OnDrop(table string, n int) {
	m.dropped.WithLabelValues(table).Add(float64(n))
}

// OnOldest implements retention.OldestHook.
func (m *Metrics) OnOldest(table string, age time.Duration) {
	m.oldest.WithLabelValues(table).Set(age.Seconds())
}

// PrunedCounter returns idem_inbox_markers_pruned_total, for tests.
func (m *Metrics) PrunedCounter() *prometheus.CounterVec { return m.pruned }

var (
	_ idem.OutcomeHook           = (*Metrics)(nil)
	_ idem.AttemptHook           = (*Metrics)(nil)
	_ idembroker.SettleHook      = (*Metrics)(nil)
	_ idembroker.DeadLetterHook  = (*Metrics)(nil)
	_ idembroker.RedeliveredHook = (*Metrics)(nil)
)
