package idem

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
)

func TestDispose(t *testing.T) {
	p, err := NewProcessor[struct{}](nopStore{}, &Config[struct{}]{Consumer: "x", Key: ByMessageID,
		Handler: func(context.Context, struct{}, Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		r    Result
		want Action
	}{
		{Result{Outcome: Applied}, ActionAck},
		{Result{Outcome: Duplicate}, ActionAck},
		{Result{Outcome: DeadLettered, Err: ErrBadKey}, ActionDeadLetter},
		{Result{Outcome: Expired, Err: ErrExpired}, ActionDeadLetter},
		{Result{Outcome: Retry, Err: ErrCommitUnknown, Attempts: 1}, ActionRedeliver},
		{Result{Outcome: Retry, Err: ErrUnavailable, Blameless: true}, ActionHold},
		{Result{Outcome: Retry, Err: ErrMisconfigured, Blameless: true}, ActionHold},
		{Result{Outcome: Retry, Err: ErrNotAttempted, Blameless: true}, ActionHold},
		{Result{}, ActionRedeliver}, // unknown: the broker keeps it
	}
	for _, c := range cases {
		d := p.Dispose(c.r)
		if d.Action != c.want {
			t.Errorf("%v (%v, blameless %v): %v, want %v", c.r.Outcome, c.r.Err, c.r.Blameless, d.Action, c.want)
		}
		if c.r.Err != nil && d.Reason != c.r.Err.Error() {
			t.Errorf("%v: reason %q, want the error's text", c.r.Outcome, d.Reason)
		}
		if (d.Action == ActionRedeliver || d.Action == ActionHold) && !errors.Is(c.r.Err, ErrNotAttempted) && d.Delay <= 0 {
			t.Errorf("%v: no backoff before the next try", c.r.Outcome)
		}
	}
}

// TestRetrierSpendsOnlyTheMessagesFaults pins DESIGN 11 at the one place
// that decides: an outage met while the store begins or claims, a database
// not set up for the consumer (anywhere), and the caller's shutdown cost the
// message nothing; its own failures do, and exhausting them dead-letters it.
func TestRetrierSpendsOnlyTheMessagesFaults(t *testing.T) {
	class := func(err error) idemstore.ErrorClass {
		switch {
		case errors.Is(err, errDownForTest):
			return idemstore.ClassUnavailable
		case errors.Is(err, errNoTableForTest):
			return idemstore.ClassConfig
		case errors.Is(err, errDeadlockForTest):
			return idemstore.ClassBusy
		}
		return idemstore.ClassTransient
	}
	policy := RetryPolicy{MaxAttempts: 2, Backoff: Backoff{Initial: time.Millisecond, Max: time.Millisecond}, WaitUnavailable: time.Hour, MaxContention: 10}
	r := &retrier{policy: policy, class: class}
	ctx := context.Background()
	for range 10 {
		if v := r.next(ctx, wrapStep(stepBegin, errDownForTest)); !v.again {
			t.Fatalf("outage at BEGIN gave up: %+v", v)
		}
		if v := r.next(ctx, fmt.Errorf("handling: %w", errNoTableForTest)); !v.again {
			t.Fatalf("missing table gave up: %+v", v)
		}
		if v := r.next(ctx, fmt.Errorf("handling: %w", errDeadlockForTest)); !v.again {
			t.Fatalf("a deadlock in the handler gave up: %+v", v)
		}
	}
	if r.attempt != 0 {
		t.Fatalf("outages spent %d attempts", r.attempt)
	}
	// The same unreachable service from the handler is the message's.
	if v := r.next(ctx, fmt.Errorf("handling: %w", errDownForTest)); !v.again || r.attempt != 1 {
		t.Fatalf("handler failure: %+v, attempt %d", v, r.attempt)
	}
	v := r.next(ctx, errors.New("handler: boom"))
	if v.again || v.outcome != DeadLettered || !errors.Is(v.err, ErrRetriesExhausted) {
		t.Fatalf("budget of 2 spent: %+v, want a dead letter wrapping ErrRetriesExhausted", v)
	}
	// Contention in the handler beyond MaxContention tries in a row spends
	// attempts, and says so.
	r = &retrier{policy: policy, class: class}
	for range policy.MaxContention {
		if v := r.next(ctx, fmt.Errorf("handling: %w", errDeadlockForTest)); !v.again || r.attempt != 0 || !errors.Is(v.err, ErrContention) {
			t.Fatalf("a deadlock in the handler within the bound: %+v, attempt %d", v, r.attempt)
		}
	}
	if v := r.next(ctx, fmt.Errorf("handling: %w", errDeadlockForTest)); !v.again || r.attempt != 1 {
		t.Fatalf("a deadlock in the handler past the bound: %+v, attempt %d, want one attempt spent", v, r.attempt)
	}
	if v := r.next(ctx, fmt.Errorf("handling: %w", errDeadlockForTest)); v.outcome != DeadLettered || !errors.Is(v.err, ErrContention) || !errors.Is(v.err, ErrRetriesExhausted) {
		t.Fatalf("endless contention: %+v, want a dead letter wrapping ErrContention", v)
	}
	// A claim meeting another transaction on its key stays blameless.
	r = &retrier{policy: policy, class: class}
	for range 3 * policy.MaxContention {
		if v := r.next(ctx, wrapStep(stepClaim, errDeadlockForTest)); !v.again || r.attempt != 0 || !errors.Is(v.err, ErrBusy) && v.err != nil && !errors.Is(v.err, errDeadlockForTest) {
			t.Fatalf("a claim behind another transaction: %+v, attempt %d", v, r.attempt)
		}
	}
	// After WaitUnavailable, a misconfigured database ends blameless, never
	// in a dead letter.
	r = &retrier{policy: RetryPolicy{MaxAttempts: 1, WaitUnavailable: 0}, class: class}
	r.policy.WaitUnavailable = 0
	v = r.next(ctx, wrapStep(stepClaim, errNoTableForTest))
	if v.outcome != Retry || !v.blameless || !errors.Is(v.err, ErrMisconfigured) {
		t.Fatalf("missing table after the wait: %+v, want a blameless Retry wrapping ErrMisconfigured", v)
	}
	// A context error while the caller's context is alive is the store's
	// to classify (a connect timeout is an outage), not a shutdown.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if v := (&retrier{policy: policy, class: class}).next(cctx, errors.New("x")); !v.blameless || v.outcome != Retry {
		t.Fatalf("caller gone: %+v, want blameless", v)
	}
}

var (
	errDownForTest     = errors.New("connection refused")
	errNoTableForTest  = errors.New("relation does not exist")
	errDeadlockForTest = errors.New("deadlock detected")
)

// One backoff for every config: Step doubles from Initial and stops at Max,
// WithDefaults fills only the zero fields, Validate refuses what cannot be
// a range.
func TestBackoffStepDefaultsAndRange(t *testing.T) {
	b := Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	for n, want := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 3: 40 * time.Millisecond, 4: 50 * time.Millisecond, 60: 50 * time.Millisecond} {
		if got := b.Step(n); got != want {
			t.Errorf("Step(%d) = %v, want %v", n, got, want)
		}
		if d := b.Delay(n); d < want/2 || d > want {
			t.Errorf("Delay(%d) = %v, want within [%v, %v]", n, d, want/2, want)
		}
	}
	def := Backoff{Initial: time.Second, Max: time.Minute}
	if got := (Backoff{Max: 5 * time.Second}).WithDefaults(def); got != (Backoff{Initial: time.Second, Max: 5 * time.Second}) {
		t.Errorf("WithDefaults kept %v", got)
	}
	if got := (Backoff{}).WithDefaults(def); got != def {
		t.Errorf("zero WithDefaults = %v, want %v", got, def)
	}
	for _, bad := range []Backoff{{Initial: -1}, {Initial: time.Second, Max: time.Millisecond}} {
		if bad.Validate() == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if (Backoff{}).Delay(3) != 0 || def.Validate() != nil {
		t.Error("zero backoff waits, or a valid range is refused")
	}
}
