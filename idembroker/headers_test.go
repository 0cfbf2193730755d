package idembroker_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// A dead letter's envelope reads back as it was written, through headers
// that carry strings as every broker's tools see them.
func TestEnvelopeRoundTrip(t *testing.T) {
	r := idem.Result{MessageID: "m1", Outcome: idem.DeadLettered, Attempts: 3, Err: errors.New("handling m1: permanent: no such customer")}
	d := idem.Disposition{Action: idem.ActionDeadLetter, Reason: r.Err.Error()}
	e := idembroker.NewEnvelope("billing", "invoices", r, d)
	h := map[string]string{}
	var order []string
	e.Write(func(k, v string) { h[k] = v; order = append(order, k) },
		func(k string, n int64) { h[k] = strconv.FormatInt(n, 10); order = append(order, k) })
	if got := idembroker.ReadEnvelope(h); got != e {
		t.Fatalf("read back %+v, wrote %+v", got, e)
	}
	if e.Reason != r.Err.Error() || e.Outcome != "dead_lettered" || e.Consumer != "billing" || e.Attempts != 3 || e.Origin != "invoices" {
		t.Errorf("envelope %+v", e)
	}
	if len(order) != len(idembroker.EnvelopeHeaders)-1 { // Redriven is zero
		t.Errorf("wrote %v, want the envelope's headers but %s", order, idembroker.HeaderRedriven)
	}
	// A result without an error is dead-lettered for its outcome.
	if e := idembroker.NewEnvelope("c", "q", idem.Result{Outcome: idem.Expired}, idem.Disposition{}); e.Reason != "expired" {
		t.Errorf("reason %q, want the outcome", e.Reason)
	}
	if e := idembroker.ReadEnvelope(map[string]string{idembroker.HeaderAttempts: "x"}); e.Attempts != 0 {
		t.Errorf("attempts %d from a non-number", e.Attempts)
	}
}

func TestParseEventTime(t *testing.T) {
	want := time.Date(2026, 9, 1, 2, 14, 11, 0, time.UTC)
	for _, v := range []string{"2026-09-01T02:14:11Z", strconv.FormatInt(want.UnixMilli(), 10)} {
		if got, err := idembroker.ParseEventTime(v); err != nil || !got.Equal(want) {
			t.Errorf("ParseEventTime(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	if _, err := idembroker.ParseEventTime("yesterday"); err == nil {
		t.Error("ParseEventTime(yesterday) did not fail")
	}
}
