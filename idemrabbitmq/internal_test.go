package idemrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// nopStore lets internal tests build a processor without a database; they
// never process through it.
type nopStore struct{}

func (nopStore) Begin(context.Context) (struct{}, error)  { return struct{}{}, nil }
func (nopStore) Commit(context.Context, struct{}) error   { return nil }
func (nopStore) Rollback(context.Context, struct{}) error { return nil }
func (nopStore) Classify(error) idem.ErrorClass           { return idem.ClassTransient }
func (nopStore) Lookup(context.Context, struct{}, string, []string) (map[string]idem.Marker, error) {
	return nil, nil
}
func (nopStore) Claim(_ context.Context, _ struct{}, _ string, c []idem.Claim, _ time.Duration) ([]bool, error) {
	return make([]bool, len(c)), nil
}

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
	if cfg.URL == "" {
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

// Requeue and reconnect waits come from idem.RetryPolicy: exponential from
// the first wait, capped, jittered over the upper half.
func TestBackoffsUseTheRetryPolicy(t *testing.T) {
	t.Parallel()
	c := newTestConsumer(t, &Config{
		RequeueBackoff: 100 * time.Millisecond, MaxRequeueBackoff: 400 * time.Millisecond,
		ReconnectBackoff: 10 * time.Millisecond, MaxReconnectBackoff: 50 * time.Millisecond,
	})
	for _, tc := range []struct {
		name     string
		p        idem.RetryPolicy
		attempt  int
		min, max time.Duration
	}{
		{"requeue 1", c.requeueBackoff, 1, 50 * time.Millisecond, 100 * time.Millisecond},
		{"requeue 2", c.requeueBackoff, 2, 100 * time.Millisecond, 200 * time.Millisecond},
		{"requeue capped", c.requeueBackoff, 30, 200 * time.Millisecond, 400 * time.Millisecond},
		{"reconnect 1", c.reconnectBackoff, 1, 5 * time.Millisecond, 10 * time.Millisecond},
		{"reconnect capped", c.reconnectBackoff, 30, 25 * time.Millisecond, 50 * time.Millisecond},
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := tc.p.Backoff(tc.attempt)
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

// Only a Retry of the message's own making counts towards MaxAttempts; the
// last one turns into a dead letter that says why.
func TestDecideCountsOnlyTheMessagesOwnRetries(t *testing.T) {
	t.Parallel()
	c := newTestConsumer(t, &Config{MaxAttempts: 3})
	ctx := context.Background()
	own := idem.Result{MessageID: "inv-1", Outcome: idem.Retry, Err: errors.New("tax service timed out")}
	// What the processor marks Blameless (an outage) is held, never counted.
	outage := idem.Result{MessageID: "inv-1", Outcome: idem.Retry, Blameless: true,
		Err: fmt.Errorf("%w for 1m0s: connection refused", idem.ErrUnavailable)}
	for range 5 {
		if d := c.decide(ctx, outage); d.frame != hold || d.verb != hold {
			t.Fatalf("%v: decision %+v, want the delivery held", outage.Err, d)
		}
	}
	// An unknown commit counts: a message whose commits always end that way
	// (a handler slower than the server's idle timeout) must not loop.
	unknown := idem.Result{MessageID: "inv-2", Outcome: idem.Retry, Err: fmt.Errorf("%w: %w", idem.ErrBatchFailed, idem.ErrCommitUnknown)}
	if d := c.decide(ctx, unknown); d.frame != Requeue || c.retries.add("inv-2") != 2 {
		t.Fatalf("unknown commit: decision %+v, want a counted requeue", d)
	}
	c.retries.forget("inv-2")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for range 5 {
		if d := c.decide(cancelled, own); d.frame != hold {
			t.Fatalf("shutting down: decision %+v, want the delivery held (left to the channel's close)", d)
		}
	}
	for i := 1; i < 3; i++ {
		if d := c.decide(ctx, own); d.frame != Requeue {
			t.Fatalf("retry %d: decision %+v, want a requeue", i, d)
		}
	}
	d := c.decide(ctx, own)
	if d.frame != DeadLetter || d.verb != DeadLetter || d.res.Outcome != idem.DeadLettered ||
		!errors.Is(d.res.Err, idem.ErrRetriesExhausted) || !strings.Contains(d.res.Err.Error(), "tax service timed out") {
		t.Fatalf("retry 3: decision %+v (%v), want a dead letter wrapping ErrRetriesExhausted", d, d.res.Err)
	}
	// Settled for good: the count starts again.
	if d := c.decide(ctx, own); d.frame != Requeue {
		t.Fatalf("after the dead letter: %+v", d)
	}
	// Applied forgets the count too.
	c.decide(ctx, idem.Result{MessageID: "inv-1", Outcome: idem.Applied})
	if n := c.retries.len(); n != 0 {
		t.Fatalf("%d counts left after the message was applied", n)
	}
}

func TestDecideWithoutCount(t *testing.T) {
	t.Parallel()
	c := newTestConsumer(t, &Config{MaxAttempts: -1})
	for range 50 {
		if d := c.decide(context.Background(), idem.Result{MessageID: "inv-1", Outcome: idem.Retry, Err: errors.New("x")}); d.frame != Requeue {
			t.Fatalf("decision %+v, want a requeue: the count is disabled", d)
		}
	}
}

func TestRetryCountsStayBounded(t *testing.T) {
	t.Parallel()
	r := newRetryCounts(100)
	for i := range 1000 {
		r.add(fmt.Sprint("m", i))
		r.add("hot")
	}
	if n := r.len(); n != 100 {
		t.Fatalf("%d entries, want the cap of 100", n)
	}
}
