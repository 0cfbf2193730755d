package idembroker_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemstore"
)

// TestHealthShowsAPause: a hold of a paused consumer shows the pause (when,
// who, why) and keeps the consumer ready; the next acknowledgement clears it.
func TestHealthShowsAPause(t *testing.T) {
	hs := idembroker.NewHealthState("billing", "q")
	now := time.Now()
	hs.Start(now)
	hs.Connect(now)
	since := now.Add(-time.Minute)
	paused := idem.Result{Outcome: idem.Retry, Blameless: true, Err: &idem.PausedError{Consumer: "billing",
		Pause: idemstore.Pause{Paused: true, Since: since, By: "alice", Why: "incident 42"}}}
	hs.Settle(idem.Disposition{Action: idem.ActionHold, Delay: idem.PauseHoldDelay}, paused, now)
	h := hs.Health()
	if !h.Paused || !h.PausedSince.Equal(since) || h.PausedBy != "alice" || h.PauseReason != "incident 42" || h.Holding || h.Ready() != nil {
		t.Fatalf("health while paused: %+v (ready: %v)", h, h.Ready())
	}
	hs.Settle(idem.Disposition{Action: idem.ActionAck}, idem.Result{Outcome: idem.Applied}, now)
	if h := hs.Health(); h.Paused || h.PausedBy != "" {
		t.Fatalf("health after the resume: %+v", h)
	}
}
