package idembroker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// outageResult is a Retry the way the processor reports a database it
// waited for past RetryPolicy.WaitUnavailable.
func outageResult() idem.Result {
	return idem.Result{Outcome: idem.Retry, Blameless: true,
		Err: fmt.Errorf("for 1m0s: %w: dial tcp 127.0.0.1:5432: connect: connection refused", idem.ErrUnavailable)}
}

// dispose is the disposition the processor gives r (Processor.Dispose,
// pinned by TestDispose), without the delay.
func dispose(r idem.Result) idem.Disposition {
	d := idem.Disposition{}
	if r.Err != nil {
		d.Reason = r.Err.Error()
	}
	switch {
	case r.Outcome.Acked():
		d.Action = idem.ActionAck
	case r.Outcome == idem.DeadLettered || r.Outcome == idem.Expired:
		d.Action = idem.ActionDeadLetter
	case r.Blameless:
		d.Action = idem.ActionHold
	default:
		d.Action = idem.ActionRedeliver
	}
	return d
}

func TestHealthStateReadiness(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s := idembroker.NewHealthState("billing", "invoices")
	if err := s.Health().Ready(); !errors.Is(err, idembroker.ErrNotReady) || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("before Run: Ready() = %v, want not running", err)
	}
	s.Start(t0)
	if err := s.Health().Ready(); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Fatalf("started, not connected: Ready() = %v", err)
	}
	if err := s.Health().Live(t0); err != nil {
		t.Fatalf("started: Live() = %v, want alive while connecting", err)
	}
	s.Connect(t0.Add(time.Second))
	if err := s.Health().Ready(); err != nil {
		t.Fatalf("connected: Ready() = %v", err)
	}
	if got := s.Health().ConnectedSince; !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("ConnectedSince = %v", got)
	}

	out := outageResult()
	d := dispose(out)
	s.Settle(d, out, t0.Add(2*time.Second))
	s.Settle(d, out, t0.Add(3*time.Second)) // held again: the hold began at the first
	h := s.Health()
	if !h.Holding || !h.HoldingSince.Equal(t0.Add(2*time.Second)) || !strings.Contains(h.HoldReason, "connection refused") {
		t.Fatalf("after a hold for an outage: %+v", h)
	}
	if err := h.Ready(); err == nil || !strings.Contains(err.Error(), "holding messages since 2026-12-01T10:00:02Z") {
		t.Fatalf("holding: Ready() = %v", err)
	}
	if err := h.Live(t0.Add(time.Hour)); err != nil {
		t.Fatalf("holding: Live() = %v, want alive (a restart does not bring the database back)", err)
	}

	ack := idem.Result{Outcome: idem.Applied, MessageID: "m1"}
	s.Settle(dispose(ack), ack, t0.Add(4*time.Second))
	h = s.Health()
	if h.Holding || !h.LastSuccess.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("after an ack: %+v", h)
	}
	if err := h.Ready(); err != nil {
		t.Fatalf("after an ack: Ready() = %v", err)
	}

	s.Disconnect(errors.New("connection closed: CONNECTION_FORCED"), t0.Add(5*time.Second))
	if err := s.Health().Ready(); err == nil || !strings.Contains(err.Error(), "CONNECTION_FORCED") {
		t.Fatalf("disconnected: Ready() = %v, want the cause", err)
	}
	s.Stop(t0.Add(6 * time.Second))
	if h := s.Health(); h.Running || h.Connected || h.Live(t0) == nil {
		t.Fatalf("stopped: %+v", h)
	}
}

// Only an outage or a misconfigured inbox is a hold a probe sees: a
// shutdown, or a message not attempted because one before it waits, is
// not.
func TestHealthStateHoldsOnlyForOutages(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cases := []struct {
		name string
		res  idem.Result
		hold bool
	}{
		{"unavailable", outageResult(), true},
		{"misconfigured", idem.Result{Outcome: idem.Retry, Blameless: true, Err: fmt.Errorf("for 1m0s: %w: relation \"idem_inbox\" does not exist", idem.ErrMisconfigured)}, true},
		{"inbox not ready", idem.Result{Outcome: idem.Retry, Blameless: true, Err: fmt.Errorf("%w: reading settings", idem.ErrInboxNotReady)}, true},
		{"shutdown", idem.Result{Outcome: idem.Retry, Blameless: true, Err: fmt.Errorf("beginning: %w", context.Canceled)}, false},
		{"not attempted", idem.Result{Outcome: idem.Retry, Blameless: true, Err: idem.ErrNotAttempted}, false},
		{"commit unknown", idem.Result{Outcome: idem.Retry, Err: idem.ErrCommitUnknown}, false},
	}
	for _, c := range cases {
		s := idembroker.NewHealthState("billing", "invoices")
		s.Start(now)
		s.Connect(now)
		s.Settle(dispose(c.res), c.res, now)
		if h := s.Health(); h.Holding != c.hold {
			t.Errorf("%s: Holding = %v, want %v", c.name, h.Holding, c.hold)
		}
		// A shutdown or a message waiting its turn is no failure; an
		// outage and a lost commit are.
		wantErr := c.hold || c.res.Err == idem.ErrCommitUnknown
		if h := s.Health(); (h.LastError != "") != wantErr {
			t.Errorf("%s: LastError %q, want one recorded: %v", c.name, h.LastError, wantErr)
		}
	}
}

func TestHealthStateUnreachableAtStart(t *testing.T) {
	t.Parallel()
	now := time.Now()
	s := idembroker.NewHealthState("billing", "invoices")
	s.Start(now)
	s.Connect(now)
	s.Unreachable(fmt.Errorf("%w: %w: dial tcp: i/o timeout", idem.ErrInboxNotReady, idem.ErrUnavailable), now)
	if err := s.Health().Ready(); err == nil || !strings.Contains(err.Error(), "i/o timeout") {
		t.Fatalf("unreachable at start: Ready() = %v", err)
	}
	s.Reachable(now)
	if err := s.Health().Ready(); err != nil {
		t.Fatalf("reachable: Ready() = %v", err)
	}
}

func TestHealthStateWedged(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s := idembroker.NewHealthState("billing", "invoices")
	s.Start(t0)
	first := s.Begin(t0)
	second := s.Begin(t0.Add(time.Minute))
	if err := s.Health().Live(t0.Add(idembroker.StallAfter)); err != nil {
		t.Fatalf("busy for StallAfter: Live() = %v", err)
	}
	if err := s.Health().Live(t0.Add(idembroker.StallAfter + time.Second)); err == nil || !strings.Contains(err.Error(), "wedged") {
		t.Fatalf("busy past StallAfter: Live() = %v, want wedged", err)
	}
	s.End(first, t0.Add(10*time.Minute)) // the oldest came back
	if err := s.Health().Live(t0.Add(6*time.Minute + time.Second)); err == nil {
		t.Fatalf("the second batch in the database since minute 1: Live() at 6m01s = nil, want wedged")
	}
	if h := s.Health(); !h.BusySince.Equal(t0.Add(time.Minute)) {
		t.Fatalf("BusySince = %v, want the second batch's start", h.BusySince)
	}
	s.End(second, t0.Add(11*time.Minute))
	if h := s.Health(); !h.BusySince.IsZero() {
		t.Fatalf("idle: BusySince = %v", h.BusySince)
	}
	if err := s.Health().Live(t0.Add(24 * time.Hour)); err != nil {
		t.Fatalf("idle for a day: Live() = %v, want alive", err)
	}

	// One batch that never comes back is seen however many others do (a
	// Kafka partition whose handler blocks while the others flow).
	s = idembroker.NewHealthState("billing", "invoices")
	s.Start(t0)
	s.Begin(t0) // never ends
	for m := 1; m <= 10; m++ {
		at := t0.Add(time.Duration(m) * time.Minute)
		s.End(s.Begin(at), at.Add(time.Second))
	}
	if err := s.Health().Live(t0.Add(10*time.Minute + time.Second)); err == nil || !strings.Contains(err.Error(), "wedged") {
		t.Fatalf("one batch in the database for 10m among batches that came back: Live() = %v, want wedged", err)
	}
}

type checker struct{ s *idembroker.HealthState }

func (c checker) Health() idembroker.Health { return c.s.Health() }

func TestHealthHandlers(t *testing.T) {
	t.Parallel()
	now := time.Now()
	a := idembroker.NewHealthState("billing", "invoices")
	b := idembroker.NewHealthState("ledger", "payments")
	for _, s := range []*idembroker.HealthState{a, b} {
		s.Start(now)
		s.Connect(now)
	}
	mux := http.NewServeMux()
	idembroker.HandleHealth(mux, checker{a}, checker{b})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	type body struct {
		Status    string              `json:"status"`
		Errors    []string            `json:"errors"`
		Consumers []idembroker.Health `json:"consumers"`
	}
	get := func(path string) (int, body) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s: Content-Type %q", path, ct)
		}
		var b body
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
			t.Fatalf("%s: decoding: %v", path, err)
		}
		return resp.StatusCode, b
	}

	for _, path := range []string{"/readyz", "/healthz"} {
		code, b := get(path)
		if code != http.StatusOK || b.Status != "ok" || len(b.Consumers) != 2 || b.Consumers[1].Consumer != "ledger" {
			t.Fatalf("%s all well: %d %+v", path, code, b)
		}
	}

	out := outageResult()
	b.Settle(idem.Disposition{Action: idem.ActionHold, Reason: out.Err.Error()}, out, now)
	code, body1 := get("/readyz")
	if code != http.StatusServiceUnavailable || body1.Status != "unavailable" || len(body1.Errors) != 1 ||
		!strings.Contains(body1.Errors[0], "ledger is holding") || !body1.Consumers[1].Holding {
		t.Fatalf("/readyz while ledger holds: %d %+v", code, body1)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while ledger holds: %d, want 200", code)
	}
	a.Stop(now)
	if code, b := get("/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(strings.Join(b.Errors, ";"), "billing is not running") {
		t.Fatalf("/healthz with billing stopped: %d %+v", code, b)
	}
}

// A service serves its consumers' probes in one line; here a consumer
// whose database went away answers /readyz with 503 and why.
func ExampleHandleHealth() {
	s := idembroker.NewHealthState("billing", "invoices") // a consumer's, e.g. idemrabbitmq.Consumer
	s.Start(time.Now())
	s.Connect(time.Now())
	out := outageResult()
	s.Settle(idem.Disposition{Action: idem.ActionHold, Reason: out.Err.Error()}, out, time.Now())

	mux := http.NewServeMux()
	idembroker.HandleHealth(mux, checker{s}) // idembroker.HandleHealth(mux, consumer)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			panic(err)
		}
		var body struct{ Status string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		fmt.Println(path, resp.StatusCode, body.Status)
	}
	// Output:
	// /healthz 200 ok
	// /readyz 503 unavailable
}

// BenchmarkHealthStateSettle is what keeping the health costs each
// settled message, with the adapters' goroutines settling at once.
func BenchmarkHealthStateSettle(b *testing.B) {
	s := idembroker.NewHealthState("billing", "invoices")
	r := idem.Result{Outcome: idem.Applied}
	d := idem.Disposition{Action: idem.ActionAck}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Settle(d, r, time.Now())
		}
	})
}
