package report

import "testing"

// TestRatios pins the baseline: the best error-free hand-rolled batch of
// each broker, a failed one ignored, and no ratio where a broker has none.
func TestRatios(t *testing.T) {
	rs := []Result{
		{Broker: "rabbitmq", Key: Baseline, Rate: 100},
		{Broker: "rabbitmq", Key: Baseline, Rate: 400, Error: "not exactly once"},
		{Broker: "rabbitmq", Key: Baseline, Rate: 200},
		{Broker: "rabbitmq", Key: "idem-batch", Rate: 300},
		{Broker: "kafka", Key: "idem-batch", Rate: 50},
	}
	Ratios(rs)
	for i, want := range []float64{0.5, 2, 1, 1.5, 0} {
		if rs[i].Ratio != want {
			t.Errorf("result %d (%s/%s at %v): ratio %v, want %v", i, rs[i].Broker, rs[i].Key, rs[i].Rate, rs[i].Ratio, want)
		}
	}
	best := Best(rs)
	if len(best) != 3 || best[0].Rate != 200 || best[1].Rate != 300 || best[2].Broker != "kafka" {
		t.Errorf("Best = %+v", best)
	}
}
