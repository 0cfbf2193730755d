package idem

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/nopstore"
)

// nopStore is a store without a database, for configuration tests; a test
// that needs one method to behave embeds it and overrides that method.
type nopStore struct{ nopstore.Store[struct{}] }

func TestNewProcessorRefusesBadConfig(t *testing.T) {
	h := func(context.Context, struct{}, Message) error { return nil }
	cases := []struct {
		name string
		cfg  Config[struct{}]
		msg  string
	}{
		{"no consumer", Config[struct{}]{Key: ByMessageID, Handler: h}, "consumer name"},
		{"upper case", Config[struct{}]{Consumer: "Billing", Key: ByMessageID, Handler: h}, "consumer name"},
		{"too long", Config[struct{}]{Consumer: "a" + strings.Repeat("b", 63), Key: ByMessageID, Handler: h}, "consumer name"},
		{"no key", Config[struct{}]{Consumer: "billing", Handler: h}, "key func is required"},
		{"no handler", Config[struct{}]{Consumer: "billing", Key: ByMessageID}, "handler is required"},
		{"bad backoff", Config[struct{}]{Consumer: "billing", Key: ByMessageID, Handler: h,
			Retry: RetryPolicy{Backoff: Backoff{Initial: time.Second, Max: time.Millisecond}}}, "backoff"},
		{"negative attempts", Config[struct{}]{Consumer: "billing", Key: ByMessageID, Handler: h,
			Retry: RetryPolicy{MaxAttempts: -1}}, "max attempts"},
	}
	for _, c := range cases {
		_, err := NewProcessor[struct{}](nopStore{}, &c.cfg)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: err = %v, want ErrConfig mentioning %q", c.name, err, c.msg)
		}
	}
	ok := Config[struct{}]{Consumer: "billing-invoice.v2", Key: ByMessageID, Handler: h}
	if _, err := NewProcessor[struct{}](nopStore{}, &ok); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	natural := Config[struct{}]{Consumer: "stats", Natural: true, Handler: h}
	if _, err := NewProcessor[struct{}](nopStore{}, &natural); err != nil {
		t.Fatalf("natural consumer without key refused: %v", err)
	}
}

func TestBackoffIsBoundedAndJittered(t *testing.T) {
	p := RetryPolicy{}
	p.setDefaults()
	seen := map[time.Duration]bool{}
	for attempt := 1; attempt < 20; attempt++ {
		for range 20 {
			d := p.Backoff.Delay(attempt)
			if d < 0 || d > p.Backoff.Max {
				t.Fatalf("attempt %d: backoff %v outside [0, %v]", attempt, d, p.Backoff.Max)
			}
			seen[d] = true
		}
	}
	if len(seen) < 10 {
		t.Fatalf("backoff shows no jitter: %d distinct values", len(seen))
	}
	if first := p.Backoff.Delay(1); first > p.Backoff.Initial {
		t.Fatalf("first backoff %v above initial %v", first, p.Backoff.Initial)
	}
}

func TestPermanentWrapping(t *testing.T) {
	base := errors.New("unknown merchant")
	err := Permanent(base)
	if !IsPermanent(err) || !errors.Is(err, base) {
		t.Fatalf("Permanent must be detectable and keep its cause")
	}
	if IsPermanent(base) || Permanent(nil) != nil {
		t.Fatalf("plain errors are not permanent; Permanent(nil) is nil")
	}
	if Applied.String() != "applied" || DeadLettered.String() != "dead_lettered" || Outcome(0).String() != "unknown" {
		t.Fatalf("outcome names changed: they are metric labels")
	}
	if !Applied.Acked() || !Duplicate.Acked() || Retry.Acked() || DeadLettered.Acked() || Expired.Acked() {
		t.Fatalf("only Applied and Duplicate are acked")
	}
}
