package idem

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
)

func procFor(t *testing.T, store idemstore.Store[struct{}], mod func(*Config[struct{}])) *Processor[struct{}] {
	t.Helper()
	cfg := &Config[struct{}]{Consumer: "x", Key: ByMessageID,
		Handler: func(context.Context, struct{}, Message) error { return nil }}
	if mod != nil {
		mod(cfg)
	}
	p, err := NewProcessor(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBlankKeysAreBadInput(t *testing.T) {
	p := procFor(t, nopStore{}, func(c *Config[struct{}]) {
		c.Key = func(Message) (string, error) { return " \t ", nil }
	})
	it := p.prepare(Message{ID: "m1"})
	if it.res.Outcome != DeadLettered || !errors.Is(it.res.Err, ErrBadKey) {
		t.Fatalf("blank key: %v %v, want a dead letter wrapping ErrBadKey", it.res.Outcome, it.res.Err)
	}
	if it := p.prepare(Message{ID: "  "}); it.res.Outcome != DeadLettered {
		t.Fatalf("blank message ID: %v", it.res.Outcome)
	}
}

func TestUntimedAndFutureTimes(t *testing.T) {
	now := time.Date(2026, 3, 15, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	p := procFor(t, nopStore{}, func(c *Config[struct{}]) { c.Horizon.Now = clock; c.Horizon.Window = 24 * time.Hour })
	it := p.prepare(Message{ID: "m1"})
	if it.res.Outcome != 0 || !it.res.Untimed || it.res.TimeSource != TimeNone {
		t.Fatalf("untimed message: %+v, want accepted and flagged untimed", it.res)
	}
	it = p.prepare(Message{ID: "m2", Time: now.Add(3 * time.Hour), TimeSource: TimeFromHeader})
	if it.res.Outcome != 0 || !it.res.Untimed || !it.claim.EventTime.IsZero() {
		t.Fatalf("event time 3h ahead: %+v, claim time %v; want it treated as untimed", it.res, it.claim.EventTime)
	}
	it = p.prepare(Message{ID: "m3", Time: now.Add(-time.Hour), TimeSource: TimeFromBroker})
	if it.res.Untimed || it.res.TimeSource != TimeFromBroker || !it.claim.EventTime.Equal(now.Add(-time.Hour)) {
		t.Fatalf("timed message: %+v", it.res)
	}
	refuse := procFor(t, nopStore{}, func(c *Config[struct{}]) { c.RefuseUntimed = true; c.Horizon.Now = clock })
	if it := refuse.prepare(Message{ID: "m1"}); it.res.Outcome != DeadLettered || !errors.Is(it.res.Err, ErrUntimed) {
		t.Fatalf("RefuseUntimed: %v %v, want a dead letter wrapping ErrUntimed", it.res.Outcome, it.res.Err)
	}
}

func TestEventTimeSources(t *testing.T) {
	id := "019cf1a2-b3c4-7def-8123-456789abcdef"
	h, b := time.Unix(100, 0), time.Unix(200, 0)
	if tm, src := EventTime(id, h, b); src != TimeFromID || tm.UnixMilli() != 0x019cf1a2b3c4 {
		t.Errorf("UUIDv7 ID: %v %v", tm, src)
	}
	if tm, src := EventTime("evt-1", h, b); src != TimeFromHeader || !tm.Equal(h) {
		t.Errorf("header: %v %v", tm, src)
	}
	if tm, src := EventTime("evt-1", time.Time{}, b); src != TimeFromBroker || !tm.Equal(b) {
		t.Errorf("broker: %v %v", tm, src)
	}
	if _, src := EventTime("evt-1", time.Time{}, time.Time{}); src != TimeNone {
		t.Errorf("none: %v", src)
	}
}

// partStore is a store configured for the partitioned layout.
type partStore struct{ nopStore }

func (partStore) Layout() idemstore.Layout { return idemstore.LayoutPartitioned }

func TestPartitionTimeIsAFunctionOfTheKey(t *testing.T) {
	id := "019cf1a2-b3c4-7def-8123-456789abcdef" // 2026-03-15 13:14:57Z
	idTime, _ := TimeFromUUIDv7(id)
	now := idTime.Add(time.Hour)
	clock := func() time.Time { return now }
	// A business key cannot be placed by the message's UUIDv7: two
	// messages for one invoice would land on two markers.
	_, err := NewProcessor[struct{}](partStore{}, &Config[struct{}]{Consumer: "x",
		Key:     JSONKey(func(v struct{ Invoice string }) string { return v.Invoice }),
		Handler: func(context.Context, struct{}, Message) error { return nil }})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("partitioned inbox with a business key and no PartitionTime: %v, want ErrConfig", err)
	}
	p := procFor(t, partStore{}, func(c *Config[struct{}]) { c.Horizon.Now = clock; c.Horizon.Window = 14 * 24 * time.Hour })
	a := p.prepare(Message{ID: id, Time: now.Add(-time.Minute), TimeSource: TimeFromBroker})
	b := p.prepare(Message{ID: id, Time: now.Add(-time.Second), TimeSource: TimeFromBroker})
	if a.res.Outcome != 0 || !a.claim.PartitionTime.Equal(idTime) || !b.claim.PartitionTime.Equal(a.claim.PartitionTime) {
		t.Fatalf("republished with a new timestamp: partition times %v and %v, want both %v", a.claim.PartitionTime, b.claim.PartitionTime, idTime)
	}
	if it := p.prepare(Message{ID: "evt-42", Time: now}); it.res.Outcome != DeadLettered || !errors.Is(it.res.Err, ErrNoPartitionTime) {
		t.Fatalf("non-UUIDv7 ID on a partitioned inbox: %v %v, want a dead letter wrapping ErrNoPartitionTime", it.res.Outcome, it.res.Err)
	}
	// The horizon judges a partitioned marker by its partition time: its
	// day is dropped by that time, whatever the message's own time says.
	late := procFor(t, partStore{}, func(c *Config[struct{}]) {
		c.Horizon.Now = func() time.Time { return idTime.Add(20 * 24 * time.Hour) }
		c.Horizon.Window = 14 * 24 * time.Hour
	})
	if it := late.prepare(Message{ID: id, Time: idTime.Add(20 * 24 * time.Hour)}); it.res.Outcome != Expired {
		t.Fatalf("partition time older than the window: %v %v, want Expired", it.res.Outcome, it.res.Err)
	}
	// A declared rule: the period's start.
	period := procFor(t, partStore{}, func(c *Config[struct{}]) {
		c.Horizon.Now = clock
		c.Horizon.Window = 60 * 24 * time.Hour
		c.Key = func(m Message) (string, error) { return "invoice:c1:2026-03", nil }
		c.PartitionTime = func(key string) (time.Time, error) {
			return time.Parse("2006-01", key[len(key)-7:])
		}
	})
	// The period's start as partition time: the window must be longer than
	// a period plus its messages' lateness.
	x := period.prepare(Message{ID: "m-1", Time: now.Add(-24 * time.Hour)})
	y := period.prepare(Message{ID: "m-2", Time: now})
	if x.res.Outcome != 0 || !x.claim.PartitionTime.Equal(y.claim.PartitionTime) {
		t.Fatalf("two messages for one invoice: %v %v, partition times %v %v", x.res.Outcome, x.res.Err, x.claim.PartitionTime, y.claim.PartitionTime)
	}
}

// settingsStore stores its settings in memory, for configuration tests of
// the processor's reading of them.
type settingsStore struct {
	nopStore
	s idemstore.Settings
}

func (s *settingsStore) Settings(context.Context) (idemstore.Settings, error) { return s.s, nil }

func (s *settingsStore) SettingsIn(context.Context, struct{}) (idemstore.Settings, error) {
	return s.s, nil
}

func TestStoredWindowRules(t *testing.T) {
	ctx := context.Background()
	store := &settingsStore{s: idemstore.Settings{Window: 30 * 24 * time.Hour}}
	p := procFor(t, store, nil)
	if err := p.ready(ctx, true); err != nil || p.horizon().Window != store.s.Window {
		t.Fatalf("default horizon under a stored 30-day window: %v, %v", p.horizon().Window, err)
	}
	long := procFor(t, store, func(c *Config[struct{}]) {
		c.Horizon.Window = 40 * 24 * time.Hour
		c.Retry.WaitUnavailable = 10 * time.Millisecond
	})
	err := long.ready(ctx, true)
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("horizon 40d over a stored 30d window: %v, want ErrConfig", err)
	}
	r := long.Process(ctx, Message{ID: "m1"})
	if r.Outcome != Retry || !r.Blameless || long.Dispose(r).Action != ActionHold {
		t.Fatalf("message under a refused horizon: %v (%v, blameless %v), want held", r.Outcome, r.Err, r.Blameless)
	}
	// The window shortened under a running consumer is seen at the next read.
	store.s.Window = 7 * 24 * time.Hour
	if err := p.ready(ctx, true); err != nil || p.horizon().Window != 7*24*time.Hour {
		t.Fatalf("after the window was shortened: %v, %v", p.horizon().Window, err)
	}
}

// prunedStore reports one summary of pruned keys.
type prunedStore struct {
	nopStore
	day  time.Time
	keys map[string]bool
}

func (s *prunedStore) PrunedSummaries(context.Context, string) ([]idemstore.PrunedSummary, error) {
	return []idemstore.PrunedSummary{{Day: s.day, Has: func(k string) bool { return s.keys[k] }}}, nil
}

func (s *prunedStore) PrunedSummariesIn(ctx context.Context, _ struct{}, consumer string) ([]idemstore.PrunedSummary, error) {
	return s.PrunedSummaries(ctx, consumer)
}

func TestLateDuplicatesRefused(t *testing.T) {
	ctx := context.Background()
	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	store := &prunedStore{day: day, keys: map[string]bool{"evt-old": true}}
	p := procFor(t, store, func(c *Config[struct{}]) { c.RefuseLate = true })
	if err := p.ready(ctx, true); err != nil {
		t.Fatal(err)
	}
	it := p.prepare(Message{ID: "evt-old"})
	if it.res.Outcome != Expired || !errors.Is(it.res.Err, ErrMarkerPruned) || !errors.Is(it.res.Err, ErrExpired) ||
		!it.res.PrunedOn.Equal(day) || !strings.Contains(it.res.Err.Error(), "2026-03-01") {
		t.Fatalf("pruned key: %v (%v), pruned on %v; want Expired naming the day", it.res.Outcome, it.res.Err, it.res.PrunedOn)
	}
	if it := p.prepare(Message{ID: "evt-new"}); it.res.Outcome != 0 {
		t.Fatalf("a key never pruned: %v %v", it.res.Outcome, it.res.Err)
	}
	lax := procFor(t, store, nil)
	if err := lax.ready(ctx, true); err != nil {
		t.Fatal(err)
	}
	if it := lax.prepare(Message{ID: "evt-old"}); it.res.Outcome != 0 {
		t.Fatalf("without RefuseLate the message goes on to its claim: %v", it.res.Outcome)
	}
}

// A natural consumer keeps no markers, so it needs no inbox table and no
// stored settings: it must start over a store that was never migrated.
func TestNaturalNeedsNoInbox(t *testing.T) {
	p := procFor(t, &failingSettings{}, func(c *Config[struct{}]) { c.Natural = true; c.Key = nil })
	if err := p.Check(context.Background()); err != nil {
		t.Fatalf("natural consumer over an unmigrated store: %v", err)
	}
}

type failingSettings struct{ nopStore }

func (*failingSettings) Settings(context.Context) (idemstore.Settings, error) {
	return idemstore.Settings{}, errors.New("relation idem_inbox_settings does not exist")
}

// windowedStore keeps its window in the database (Settings) and has a
// configured default (Window) that a process which never migrated holds.
type windowedStore struct {
	settingsStore
	configured time.Duration
}

func (s *windowedStore) Window() time.Duration { return s.configured }

// A horizon the stored window allows is accepted even when the store's
// configured default is shorter: the stored window decides.
func TestStoredWindowDecidesOverTheConfiguredDefault(t *testing.T) {
	store := &windowedStore{settingsStore: settingsStore{s: idemstore.Settings{Window: 30 * 24 * time.Hour}}, configured: 14 * 24 * time.Hour}
	p, err := NewProcessor[struct{}](store, &Config[struct{}]{Consumer: "x", Key: ByMessageID,
		Handler: func(context.Context, struct{}, Message) error { return nil },
		Horizon: Horizon{Window: 20 * 24 * time.Hour}})
	if err != nil {
		t.Fatalf("a 20-day horizon over a stored 30-day window, configured default 14 days: %v", err)
	}
	if err := p.ready(context.Background(), true); err != nil || p.horizon().Window != 20*24*time.Hour {
		t.Fatalf("ready: %v, horizon %v", err, p.horizon().Window)
	}
}
