// Package report is the peers benchmark's figures: what the peers command
// writes as JSON and the chart command reads, and the rules both apply to
// them (each consumer's best run, the ratio to the hand-rolled batch).
package report

import "time"

// Report is a run of the peers command.
type Report struct {
	Started  time.Time `json:"started"`
	Machine  Machine   `json:"machine"`
	Messages int       `json:"messages"`
	Dups     int       `json:"duplicates"`
	Batch    int       `json:"batch"`
	Prefetch int       `json:"prefetch"`
	Results  []Result  `json:"results"`
}

// Machine is what the figures were measured on.
type Machine struct {
	CPUs     int    `json:"cpus"`
	Go       string `json:"go"`
	OS       string `json:"os"`
	Postgres string `json:"postgres"`
	RabbitMQ string `json:"rabbitmq,omitempty"`
	Kafka    string `json:"kafka"`
	NATS     string `json:"nats,omitempty"`
	Redis    string `json:"redis,omitempty"`
}

// Result is one consumer's run.
type Result struct {
	Broker    string  `json:"broker"`
	Key       string  `json:"key"`
	Consumer  string  `json:"consumer"`
	Guarded   bool    `json:"guarded"`
	Messages  int     `json:"deliveries"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"msgs_per_s"`
	Ratio     float64 `json:"ratio_to_handrolled_batch"`
	Check     Check   `json:"check"`
	OK        bool    `json:"exactly_once"`
	Error     string  `json:"error,omitempty"`
	Absolute  bool    `json:"absolute"` // false: in-process broker, only the ratio means something
	Iteration int     `json:"iteration"`
}

// Check is what a run left in the database, against its workload.
type Check struct {
	Applied int64 `json:"applied"` // distinct messages with an effect
	Doubled int64 `json:"doubled"` // messages with more than one effect
	Missing int64 `json:"missing"` // messages of the workload without an effect
	// Balance is whether the ledger's total equals the sum of the
	// workload's distinct credits.
	Balance bool `json:"balance_ok"`
}

// ExactlyOnce reports whether every message was applied exactly once.
func (c Check) ExactlyOnce() bool { return c.Doubled == 0 && c.Missing == 0 && c.Balance }

// Baseline is the key of the consumer every ratio is to.
const Baseline = "handrolled-batch"

// Ratios sets each result's ratio to the best error-free Baseline run of
// its broker.
func Ratios(rs []Result) {
	base := map[string]float64{}
	for _, r := range rs {
		if r.Key == Baseline && r.Error == "" {
			base[r.Broker] = max(base[r.Broker], r.Rate)
		}
	}
	for i := range rs {
		if b := base[rs[i].Broker]; b > 0 {
			rs[i].Ratio = rs[i].Rate / b
		}
	}
}

// Best returns the fastest error-free run of each broker and consumer, in
// the order they first appear; a consumer without one keeps a failed run.
func Best(rs []Result) []Result {
	var out []Result
	at := map[string]int{}
	for _, r := range rs {
		k := r.Broker + "/" + r.Key
		i, ok := at[k]
		switch {
		case !ok:
			at[k] = len(out)
			out = append(out, r)
		case out[i].Error != "" || r.Error == "" && r.Rate > out[i].Rate:
			out[i] = r
		}
	}
	return out
}
