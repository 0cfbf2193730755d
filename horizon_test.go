package idem

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
)

func TestHorizonExpiresOldMessages(t *testing.T) {
	now := time.Date(2026, 3, 15, 9, 18, 0, 0, time.UTC)
	h := func(context.Context, struct{}, Message) error {
		t.Fatal("handler must not run for an expired message")
		return nil
	}
	p, err := NewProcessor[struct{}](nopStore{}, &Config[struct{}]{
		Consumer: "invoices", Key: ByMessageID, Handler: h,
		Horizon: Horizon{Window: 14 * 24 * time.Hour, Skew: time.Hour, Now: func() time.Time { return now }},
	})
	if err != nil {
		t.Fatal(err)
	}
	old := Message{ID: "evt-1", Time: now.Add(-14*24*time.Hour + 30*time.Minute)} // inside skew margin: expired
	r := p.Process(context.Background(), old)
	if r.Outcome != Expired || !errors.Is(r.Err, ErrExpired) {
		t.Fatalf("old replay: %v %v, want Expired", r.Outcome, r.Err)
	}
	rs := p.ProcessBatch(context.Background(), []Message{old})
	if rs[0].Outcome != Expired {
		t.Fatalf("old replay in a batch: %v, want Expired", rs[0].Outcome)
	}
}

func TestHorizonConfig(t *testing.T) {
	h := func(context.Context, struct{}, Message) error { return nil }
	_, err := NewProcessor[struct{}](nopStore{}, &Config[struct{}]{Consumer: "x", Key: ByMessageID, Handler: h,
		Horizon: Horizon{Window: time.Minute, Skew: time.Hour}})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("skew above window accepted: %v", err)
	}
}

func TestTimeFromUUIDv7(t *testing.T) {
	// 0x019cf1a2b3c4 ms since the epoch, version 7, variant 10.
	got, ok := TimeFromUUIDv7("019cf1a2-b3c4-7def-8123-456789abcdef")
	if !ok || got.UnixMilli() != 0x019cf1a2b3c4 {
		t.Fatalf("got %v %v", got, ok)
	}
	for _, bad := range []string{"", "not-a-uuid", "019cf1a2-b3c4-4def-8123-456789abcdef" /* v4 */, "019cf1a2-b3c4-7def-c123-456789abcdef" /* variant */} {
		if _, ok := TimeFromUUIDv7(bad); ok {
			t.Errorf("%q accepted as UUIDv7", bad)
		}
	}
}

// horizonStore is a store with a retention window, configured and stored
// with its table, for configuration tests.
type horizonStore struct {
	nopStore
	window time.Duration
}

func (s horizonStore) Window() time.Duration { return s.window }

func (s horizonStore) Settings(context.Context) (idemstore.Settings, error) {
	return idemstore.Settings{Window: s.window}, nil
}

func TestHorizonFromStore(t *testing.T) {
	h := func(context.Context, struct{}, Message) error { return nil }
	store := horizonStore{window: 14 * 24 * time.Hour}
	p, err := NewProcessor[struct{}](store, &Config[struct{}]{Consumer: "x", Key: ByMessageID, Handler: h})
	if err != nil || p.cfg.Horizon.Window != store.window {
		t.Fatalf("processor did not adopt the store's window: %v %v", p, err)
	}
	long, err := NewProcessor[struct{}](store, &Config[struct{}]{Consumer: "x", Key: ByMessageID, Handler: h,
		Horizon: Horizon{Window: 30 * 24 * time.Hour}})
	if err == nil {
		err = long.ready(context.Background(), true)
	}
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("a horizon longer than the store keeps markers was accepted: %v", err)
	}
	p, err = NewProcessor[struct{}](store, &Config[struct{}]{Consumer: "x", Key: ByMessageID, Handler: h,
		Horizon: Horizon{Window: -1}})
	if err != nil || p.cfg.Horizon.check(Message{ID: "m", Time: time.Unix(0, 0)}) != nil {
		t.Fatalf("Window -1 must disable the guard: %v", err)
	}
}
