package idemprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reconcile holds the results of reconciliation runs (package reconcile,
// `idem reconcile --every`), per consumer: what the last run found
// missing, and when it ran.
type Reconcile struct {
	missing *prometheus.GaugeVec
	lastRun *prometheus.GaugeVec
}

// NewReconcile creates the reconciliation metrics and registers them with
// reg (nil: not registered). A registerer that already holds them is
// reused rather than failing.
func NewReconcile(reg prometheus.Registerer) *Reconcile {
	r := &Reconcile{
		missing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idem_reconcile_missing",
			Help: "Messages the last reconciliation found missing, by consumer: acknowledged (sent by the source of truth) but without their marker in the consumer's inbox. Anything above 0 is an effect lost (a failover to a lagging replica, a restored backup) until repaired.",
		}, []string{"consumer"}),
		lastRun: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idem_reconcile_last_run_timestamp_seconds",
			Help: "When the last reconciliation of the consumer finished, as a Unix time: a job that stopped running leaves it behind.",
		}, []string{"consumer"}),
	}
	if reg != nil {
		r.missing = register(reg, r.missing)
		r.lastRun = register(reg, r.lastRun)
	}
	return r
}

// Observe records a finished run of consumer that found missing messages
// missing, at at.
func (r *Reconcile) Observe(consumer string, missing int, at time.Time) {
	r.missing.WithLabelValues(consumer).Set(float64(missing))
	r.lastRun.WithLabelValues(consumer).Set(float64(at.UnixNano()) / 1e9)
}
