package idemprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemstore"
)

// A pause shows as idem_consumer_paused 1 with the time it began; a resume
// sets both to 0.
func TestPauseGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	since := time.Unix(1_700_000_000, 0)
	m.OnPause("billing", idemstore.Pause{Paused: true, Since: since, By: "alice", Why: "incident"})
	want := `
# HELP idem_consumer_paused 1 while an operator has paused the consumer (idem consumer pause): its messages are held, unapplied, until it is resumed; 0 once resumed.
# TYPE idem_consumer_paused gauge
idem_consumer_paused{consumer="billing"} 1
# HELP idem_consumer_paused_since_timestamp_seconds When the consumer was paused, as a Unix time; 0 when it is not paused.
# TYPE idem_consumer_paused_since_timestamp_seconds gauge
idem_consumer_paused_since_timestamp_seconds{consumer="billing"} 1.7e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_consumer_paused", "idem_consumer_paused_since_timestamp_seconds"); err != nil {
		t.Fatal(err)
	}
	m.OnPause("billing", idemstore.Pause{})
	want = strings.ReplaceAll(strings.ReplaceAll(want, `"} 1.7e+09`, `"} 0`), `"} 1`+"\n", `"} 0`+"\n")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_consumer_paused", "idem_consumer_paused_since_timestamp_seconds"); err != nil {
		t.Fatal(err)
	}
}
