package idemrabbitmq

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/nopstore"
)

// nopStore lets internal tests build a processor without a database; they
// never process through it.
type nopStore = nopstore.Store[struct{}]

func newTestConsumer(t *testing.T, cfg *Config) *Consumer[struct{}] {
	t.Helper()
	proc, err := idem.NewProcessor[struct{}](nopStore{}, &idem.Config[struct{}]{
		Consumer: "billing-invoice",
		Key:      idem.ByMessageID,
		Handler:  func(context.Context, struct{}, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.URL == "" && len(cfg.URLs) == 0 {
		cfg.URL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if cfg.Queue == "" {
		cfg.Queue = "billing.invoice"
	}
	c, err := NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Reconnect waits come from idem.Backoff: exponential from the first
// wait, capped, jittered over the upper half.
func TestBackoffsUseIdemBackoff(t *testing.T) {
	t.Parallel()
	c := newTestConsumer(t, &Config{ReconnectBackoff: idem.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}})
	for _, tc := range []struct {
		name     string
		p        idem.Backoff
		attempt  int
		min, max time.Duration
	}{
		{"reconnect 1", c.reconnectBackoff, 1, 5 * time.Millisecond, 10 * time.Millisecond},
		{"reconnect capped", c.reconnectBackoff, 30, 25 * time.Millisecond, 50 * time.Millisecond},
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := tc.p.Delay(tc.attempt)
			if d < tc.min || d > tc.max {
				t.Fatalf("%s: backoff %v outside [%v, %v]", tc.name, d, tc.min, tc.max)
			}
			seen[d] = true
		}
		if len(seen) < 2 {
			t.Errorf("%s: no jitter (always %v)", tc.name, seen)
		}
	}
}
