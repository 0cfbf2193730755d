package storetest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retention"
)

// RetentionStore is what the retention checks need of a store: the inbox,
// its stored settings (docs/design.md 10), markers that outlive the messages
// that need them (docs/design.md 8), and the prune.
type RetentionStore[TTx any] interface {
	idemstore.Store[TTx]
	Migrate(ctx context.Context) error
	Prune(ctx context.Context, opts retention.Options) (retention.Result, error)
	Stats(ctx context.Context) (retention.Stats, error)
	SetWindow(ctx context.Context, w time.Duration, force bool) (old time.Duration, err error)
}

// RetentionEnv is one isolated database with a migrated inbox whose stored
// window is the default (14 days), and the means to make time pass for its
// markers.
type RetentionEnv[TTx any] struct {
	Env[TTx]
	Store RetentionStore[TTx]
	// Reopen returns another store on the same table configured with
	// window (0: none), not migrated yet: a second process.
	Reopen func(t *testing.T, window time.Duration) RetentionStore[TTx]
	// SetTimes sets a marker's processed_at and keep_until, as if it had
	// been written and extended at those times.
	SetTimes func(ctx context.Context, consumer, key string, processedAt, keepUntil time.Time) error
}

// RetentionHarness describes a store to the retention checks.
type RetentionHarness[TTx any] struct {
	// Open returns a fresh RetentionEnv for t; conns is the size of its
	// connection pool, as for [Harness.Open].
	Open func(t *testing.T, conns int) RetentionEnv[TTx]
}

const defaultWindow = 14 * 24 * time.Hour

// RunRetention runs the retention checks as subtests of t: the window
// stored with the table and read back, a second process with another
// window refused, a prune shorter than the stored window refused, a stored
// window change, markers extended only upward, keep_until deciding the
// prune (plain layout), and the business-key sequence of issue 11 through a
// processor.
//
// Like [Run], it runs them again under PoolOfOne on a pool of one
// connection.
func RunRetention[TTx any](t *testing.T, h RetentionHarness[TTx]) {
	runParallel(t, retentionSuite[TTx]{h: h}.checks())
	t.Run("PoolOfOne", func(t *testing.T) {
		t.Parallel()
		runParallel(t, retentionSuite[TTx]{h: h, pooled: true}.checks())
	})
}

// checks are the checks of RunRetention.
func (s retentionSuite[TTx]) checks() []check {
	return []check{
		{"StoredWindow", s.storedWindow},
		{"PruneShorterThanStoredRefused", s.pruneShorterRefused},
		{"SetWindow", s.setWindow},
		{"ExtendOnlyGrows", s.extendOnlyGrows},
		{"KeepUntilDrivesPrune", s.keepUntilDrivesPrune},
		{"BusinessKeyOutlivesPrune", s.businessKeyOutlivesPrune},
		{"FutureKeepUntilBounded", s.futureKeepUntilBounded},
		{"LateDuplicateAfterPrune", s.lateDuplicateAfterPrune},
		{"CheckRecordsHorizon", s.checkRecordsHorizon},
		{"StoredWindowJudgesHorizon", s.storedWindowJudgesHorizon},
		{"ShortenedWindowPrunesLate", s.shortenedWindowPrunesLate},
	}
}

type retentionSuite[TTx any] struct {
	h      RetentionHarness[TTx]
	pooled bool // every env on a pool of one connection
}

// open is a fresh env, on a pool of one connection on the pool-of-one run.
func (s retentionSuite[TTx]) open(t *testing.T) RetentionEnv[TTx] {
	t.Helper()
	if s.pooled {
		return s.h.Open(t, 1)
	}
	return s.h.Open(t, 0)
}

// storedWindow: Migrate stores the window; the store and a second process
// read it back; a second process configured with another window is refused
// with both numbers, one without a window adopts the stored one.
func (s retentionSuite[TTx]) storedWindow(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	set, err := env.Store.Settings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.Window != defaultWindow || set.Layout != env.Store.Layout() {
		t.Fatalf("stored settings %+v, want the %s layout and a window of %v", set, env.Store.Layout(), defaultWindow)
	}
	other := env.Reopen(t, 30*24*time.Hour)
	err = other.Migrate(ctx)
	if !errors.Is(err, idem.ErrConfig) || !strings.Contains(err.Error(), "720h0m0s") || !strings.Contains(err.Error(), "336h0m0s") ||
		!strings.Contains(err.Error(), "idem inbox window set") {
		t.Fatalf("Migrate with a window other than the stored one: %v, want a configuration error naming both windows and the command", errText(err))
	}
	if got, err := other.Settings(ctx); err != nil || got.Window != defaultWindow {
		t.Fatalf("stored window after a refused Migrate: %+v %v, want it unchanged", got, errText(err))
	}
	adopt := env.Reopen(t, 0)
	if err := adopt.Migrate(ctx); err != nil {
		t.Fatalf("Migrate without a window on an existing table: %v", err)
	}
	if w := adopt.Window(); w != defaultWindow {
		t.Fatalf("second process's horizon %v, want the stored window %v", w, defaultWindow)
	}
	same := env.Reopen(t, defaultWindow)
	if err := same.Migrate(ctx); err != nil {
		t.Fatalf("Migrate with the stored window: %v", err)
	}
}

// pruneShorterRefused: a prune with a window shorter than the stored one
// is refused, with both numbers, and deletes nothing.
func (s retentionSuite[TTx]) pruneShorterRefused(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	p := s.proc(t, env.Env, "ledger", nil)
	want(t, p.Process(ctx, msg(uuidv7(time.Now()))), idem.Applied)
	for _, w := range []time.Duration{time.Second, defaultWindow - time.Millisecond} {
		for _, dry := range []bool{false, true} {
			_, err := env.Store.Prune(ctx, retention.Options{Window: w, DryRun: dry})
			if !errors.Is(err, retention.ErrShortWindow) || !strings.Contains(err.Error(), w.String()) || !strings.Contains(err.Error(), defaultWindow.String()) {
				t.Fatalf("prune with window %v (dry run %v): %v, want it refused with retention.ErrShortWindow naming both windows", w, dry, errText(err))
			}
		}
	}
	if _, err := env.Store.Prune(ctx, retention.Options{Window: defaultWindow + time.Hour}); err != nil {
		t.Fatalf("prune with a longer window: %v", err)
	}
	if _, err := env.Store.Prune(ctx, retention.Options{}); err != nil {
		t.Fatalf("prune with the stored window: %v", err)
	}
	if n := markers(t, env.Env, "ledger"); n != 1 {
		t.Fatalf("markers = %d, want 1", n)
	}
}

// setWindow: the stored window changes only through SetWindow, which
// refuses under an hour and below a recorded horizon unless forced; every
// prune then uses the new one, and processors' guard window follows it
// (growing from the old one after a lengthening).
func (s retentionSuite[TTx]) setWindow(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	if _, err := env.Store.SetWindow(ctx, 30*time.Minute, false); err == nil {
		t.Fatalf("a window of 30m was accepted without force")
	}
	if err := env.Store.RecordHorizon(ctx, "ledger", 20*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.RecordHorizon(ctx, "stats", 2*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	// The consumer's horizon is longer than the stored window: lengthening
	// to cover it is fine, shortening below it is not.
	if old, err := env.Store.SetWindow(ctx, 30*24*time.Hour, false); err != nil || old != defaultWindow {
		t.Fatalf("lengthening the window: old %v, %v", old, errText(err))
	}
	_, err := env.Store.SetWindow(ctx, 15*24*time.Hour, false)
	if err == nil || !strings.Contains(err.Error(), "ledger") || !strings.Contains(err.Error(), "480h0m0s") {
		t.Fatalf("shortening below a recorded horizon: %v, want it refused naming the consumer and its horizon", errText(err))
	}
	// Markers older than the old window may be gone: processors may guard
	// with no more than the old window yet (it grows as time passes), while
	// the prune keeps markers for the new one at once.
	reader := env.Reopen(t, 0)
	if set, err := reader.Settings(ctx); err != nil || set.Window < defaultWindow || set.Window > defaultWindow+5*time.Minute {
		t.Fatalf("another process reads %+v %v, want the old window as the guard right after lengthening", set, errText(err))
	}
	res, err := reader.Prune(ctx, retention.Options{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(res.Cutoff); age < 30*24*time.Hour-time.Hour || age > 30*24*time.Hour+time.Hour {
		t.Fatalf("prune cut-off %v ago, want the new window's 720h", age)
	}
	if old, err := env.Store.SetWindow(ctx, 10*time.Minute, true); err != nil || old != 30*24*time.Hour {
		t.Fatalf("forced window: old %v, %v", old, errText(err))
	}
	if set, err := env.Store.Settings(ctx); err != nil || set.Window != 10*time.Minute {
		t.Fatalf("after a forced set: %+v %v", set, errText(err))
	}
}

// lookup reads one marker.
func lookup[TTx any](t *testing.T, env Env[TTx], consumer, key string) (idemstore.Marker, bool) {
	t.Helper()
	ctx := context.Background()
	tx, err := env.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Rollback(ctx, tx) }()
	ms, err := env.Store.Lookup(ctx, tx, consumer, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	m, ok := ms[key]
	return m, ok
}

// extend extends in its own committed transaction.
func extend[TTx any](t *testing.T, env RetentionEnv[TTx], consumer string, ext ...idemstore.Extension) {
	t.Helper()
	ctx := context.Background()
	tx, err := env.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Store.Extend(ctx, tx, consumer, ext); err != nil {
		_ = env.Rollback(ctx, tx)
		t.Fatal(err)
	}
	if err := env.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
}

// extendOnlyGrows: a claim's keep_until is the later of now and its event
// time, Lookup returns it, and Extend raises it only upward.
func (s retentionSuite[TTx]) extendOnlyGrows(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	p := s.proc(t, env.Env, "ledger", nil)
	before := time.Now()
	m := msg(uuidv7(before.Add(-time.Hour)))
	m.Time = before.Add(-time.Hour)
	want(t, p.Process(ctx, m), idem.Applied)
	got, ok := lookup(t, env.Env, "ledger", m.ID)
	// The database clock may differ from this one by a little.
	if !ok || got.KeepUntil.Before(before.Add(-time.Minute)) || got.KeepUntil.After(time.Now().Add(time.Minute)) {
		t.Fatalf("marker %+v: keep-until should be about the claim's time (the later of now and the event time)", got)
	}
	base := got.KeepUntil
	extend(t, env, "ledger", idemstore.Extension{Key: m.ID, KeepUntil: base.Add(-48 * time.Hour)})
	if got, _ := lookup(t, env.Env, "ledger", m.ID); !got.KeepUntil.Equal(base) {
		t.Fatalf("an earlier keep-until moved it from %v to %v", base, got.KeepUntil)
	}
	later := base.Add(30 * time.Minute).Truncate(time.Millisecond)
	extend(t, env, "ledger",
		idemstore.Extension{Key: m.ID, KeepUntil: later.Add(-time.Minute)},
		idemstore.Extension{Key: m.ID, KeepUntil: later},
		idemstore.Extension{Key: "no-such-key", KeepUntil: later})
	if got, _ := lookup(t, env.Env, "ledger", m.ID); !got.KeepUntil.Equal(later) {
		t.Fatalf("keep-until %v after extending to %v, want the latest given", got.KeepUntil, later)
	}
	extend(t, env, "ledger", idemstore.Extension{Key: m.ID, KeepUntil: later})
	extend(t, env, "other-consumer", idemstore.Extension{Key: m.ID, KeepUntil: later.Add(time.Hour)})
	if got, _ := lookup(t, env.Env, "ledger", m.ID); !got.KeepUntil.Equal(later) {
		t.Fatalf("keep-until %v, want %v: another consumer's extension must not touch this marker", got.KeepUntil, later)
	}
	if n := markers(t, env.Env, "ledger"); n != 1 {
		t.Fatalf("markers = %d, want 1: Extend must not insert", n)
	}
}

// keepUntilDrivesPrune: on the plain layout the prune goes by keep_until
// alone: a marker written long ago but extended recently stays, one whose
// keep_until is past the window goes whatever its write time.
func (s retentionSuite[TTx]) keepUntilDrivesPrune(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	if env.Store.Layout() != idemstore.LayoutPlain {
		t.Skip("the partitioned layout drops whole days by partition time")
	}
	p := s.proc(t, env.Env, "ledger", func(c *idem.Config[TTx]) { c.Horizon.Window = -1 })
	now := time.Now()
	old, young := now.Add(-defaultWindow-time.Hour), now.Add(-defaultWindow+time.Hour)
	for key, times := range map[string][2]time.Time{
		"written-old-extended": {old, young},
		"written-old":          {old, old},
		"odd-young-write":      {young, old},
	} {
		want(t, p.Process(ctx, msg(key)), idem.Applied)
		if err := env.SetTimes(ctx, "ledger", key, times[0], times[1]); err != nil {
			t.Fatal(err)
		}
	}
	st, err := env.Store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != 3 || st.Prunable != 2 || st.Window != defaultWindow || st.Headroom > -time.Hour+time.Minute {
		t.Fatalf("stats %+v: want 3 rows, 2 prunable by keep_until, the stored window, headroom about -1h", st)
	}
	res, err := env.Store.Prune(ctx, retention.Options{BatchSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Markers != 2 {
		t.Fatalf("pruned %d, want 2", res.Markers)
	}
	if _, ok := lookup(t, env.Env, "ledger", "written-old-extended"); !ok {
		t.Fatalf("a marker extended inside the window was pruned")
	}
	for _, k := range []string{"written-old", "odd-young-write"} {
		if _, ok := lookup(t, env.Env, "ledger", k); ok {
			t.Fatalf("marker %s, past the window by keep_until, survived the prune", k)
		}
	}
}

// businessKeyOutlivesPrune pins issue 11's second situation. Day 0: m1 for
// invoice c1/2026-03 is applied. Day 13: m2, another message for the same
// invoice, is a Duplicate, and extends the marker. Day 14.5: the prune
// runs. Day 15: a replay of m2, whose event time is two days old and inside
// the horizon, must still be a Duplicate: one invoice, not two. The days are
// simulated with the processor's Horizon.Now and the marker's times.
func (s retentionSuite[TTx]) businessKeyOutlivesPrune(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	if env.Store.Layout() != idemstore.LayoutPlain {
		t.Skip("on the partitioned layout the partition time of a business key is its period's; see the package retention proof")
	}
	now := time.Now()
	day := func(d float64) time.Time { return now.Add(time.Duration((d - 15) * float64(24*time.Hour))) }
	clock := day(0)
	type renewed struct {
		Customer string `json:"customer_id"`
		Period   string `json:"period"`
	}
	p := s.proc(t, env.Env, "invoices", func(c *idem.Config[TTx]) {
		c.Key = idem.JSONKey(func(e renewed) string { return "invoice:" + e.Customer + ":" + e.Period })
		c.Horizon = idem.Horizon{Window: defaultWindow, Now: func() time.Time { return clock }}
	})
	body := []byte(`{"customer_id":"c1","period":"2026-03"}`)
	const key = "invoice:c1:2026-03"
	m1 := idem.Message{ID: "m1", Body: body, Time: day(0), TimeSource: idem.TimeFromHeader}
	want(t, p.Process(ctx, m1), idem.Applied)
	if err := env.SetTimes(ctx, "invoices", key, day(0), day(0)); err != nil {
		t.Fatal(err)
	}
	clock = day(13)
	m2 := idem.Message{ID: "m2", Body: body, Time: day(13), TimeSource: idem.TimeFromHeader}
	want(t, p.Process(ctx, m2), idem.Duplicate)
	// Day 14.5 by the marker's clock: the prune's cut-off (now minus the
	// window) is day 1, past m1's times.
	clock = day(14.5)
	if _, err := env.Store.Prune(ctx, retention.Options{}); err != nil {
		t.Fatal(err)
	}
	clock = day(15)
	r := p.Process(ctx, m2)
	if r.Outcome != idem.Duplicate {
		mk, ok := lookup(t, env.Env, "invoices", key)
		t.Fatalf("day-15 replay of m2 (event time day 13): %v %v, want Duplicate; marker %+v (present %v): a Duplicate newer than its marker must extend it (idemstore.Store.Extend)",
			r.Outcome, r.Err, mk, ok)
	}
	if c := count(t, env.Effects, "invoices", ""); c != 1 {
		t.Fatalf("invoices = %d, want 1", c)
	}
}

func (s retentionSuite[TTx]) proc(t *testing.T, env Env[TTx], consumer string, mod func(*idem.Config[TTx])) *idem.Processor[TTx] {
	t.Helper()
	cfg := &idem.Config[TTx]{
		Consumer: consumer,
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx TTx, m idem.Message) error {
			return env.Apply(ctx, tx, consumer, m.ID, m.ID)
		},
		Retry:  idem.RetryPolicy{Backoff: idem.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}},
		Logger: slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(cfg)
	}
	p, err := idem.NewProcessor(env.Store, cfg)
	if err != nil {
		t.Fatalf("NewProcessor: %v", err)
	}
	return p
}

// uuidv7 is a UUIDv7 holding t, as a producer assigning them would send:
// the partitioned layout takes its partition time from it.
func uuidv7(t time.Time) string {
	const hexdigits = "0123456789abcdef"
	ms := uint64(t.UnixMilli())
	var b [16]byte
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6], b[8] = 0x70, 0x80
	n := uint64(t.UnixNano())
	for i := 15; i > 9; i-- {
		b[i], n = byte(n), n>>8
	}
	var out []byte
	for i, x := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hexdigits[x>>4], hexdigits[x&15])
	}
	return string(out)
}

// futureKeepUntilBounded: a claim or an extension with an event time far in
// the future keeps its marker at most an hour past now (a clock gone wrong
// must not write a marker no prune reaches).
func (s retentionSuite[TTx]) futureKeepUntilBounded(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	claim := func(key string, et time.Time) {
		t.Helper()
		tx, err := env.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pt := time.Time{}
		if env.Store.Layout() == idemstore.LayoutPartitioned {
			pt = time.Now()
		}
		if _, err := env.Store.Claim(ctx, tx, "ledger", []idemstore.Claim{{Key: key, MessageID: key, BodySHA256: []byte{0}, EventTime: et, PartitionTime: pt}}, 0); err != nil {
			_ = env.Rollback(ctx, tx)
			t.Fatal(err)
		}
		if err := env.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	limit := func() time.Time { return time.Now().Add(time.Hour + time.Minute) }
	claim("far-future", time.Now().Add(30*24*time.Hour))
	if m, _ := lookup(t, env.Env, "ledger", "far-future"); m.KeepUntil.After(limit()) || m.KeepUntil.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("keep-until %v for an event time 30 days ahead, want about an hour from now", m.KeepUntil)
	}
	claim("now", time.Now())
	extend(t, env, "ledger", idemstore.Extension{Key: "now", KeepUntil: time.Now().Add(365 * 24 * time.Hour)})
	if m, _ := lookup(t, env.Env, "ledger", "now"); m.KeepUntil.After(limit()) {
		t.Fatalf("keep-until %v after extending a year ahead, want at most about an hour from now", m.KeepUntil)
	}
}

// lateDuplicateAfterPrune: an untimed message whose marker the prune
// removed comes back. The inbox alone would apply it again without a word;
// the prune's summary of the keys it deleted makes it visible: flagged
// (Result.PrunedOn) by default, refused as Expired naming the day with
// RefuseLate. A key never pruned is not flagged.
func (s retentionSuite[TTx]) lateDuplicateAfterPrune(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	if env.Store.Layout() != idemstore.LayoutPlain {
		t.Skip("the partitioned layout summarises the keys of the partitions it drops; see pgxinbox's TestLateDuplicateAfterDrop")
	}
	p := s.proc(t, env.Env, "ledger", nil)
	want(t, p.Process(ctx, idem.Message{ID: "evt-old"}), idem.Applied)
	want(t, p.Process(ctx, idem.Message{ID: "evt-kept"}), idem.Applied)
	old := time.Now().Add(-20 * 24 * time.Hour)
	if err := env.SetTimes(ctx, "ledger", "evt-old", old, old); err != nil {
		t.Fatal(err)
	}
	res, err := env.Store.Prune(ctx, retention.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Markers != 1 || res.Summaries != 1 {
		t.Fatalf("prune: %d markers, %d summaries; want 1 and 1", res.Markers, res.Summaries)
	}
	sums, err := env.Store.PrunedSummaries(ctx, "ledger")
	if err != nil || len(sums) != 1 || !sums[0].Has("evt-old") || sums[0].Has("evt-kept") {
		t.Fatalf("summaries %v (%v): want one that holds evt-old and not evt-kept", len(sums), errText(err))
	}
	today := time.Now().UTC().Format(time.DateOnly)

	lax := s.proc(t, env.Env, "ledger", nil)
	r := lax.Process(ctx, idem.Message{ID: "evt-old"})
	if r.Outcome != idem.Applied || r.PrunedOn.IsZero() || r.PrunedOn.Format(time.DateOnly) != today {
		t.Fatalf("late duplicate without RefuseLate: %v, pruned on %v; want Applied and flagged with today", r.Outcome, r.PrunedOn)
	}
	if r := lax.Process(ctx, idem.Message{ID: "evt-new"}); r.Outcome != idem.Applied || !r.PrunedOn.IsZero() {
		t.Fatalf("a key never pruned: %v, pruned on %v", r.Outcome, r.PrunedOn)
	}

	want(t, lax.Process(ctx, idem.Message{ID: "evt-old-2"}), idem.Applied)
	for _, k := range []string{"evt-old", "evt-old-2"} {
		if err := env.SetTimes(ctx, "ledger", k, old, old); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.Store.Prune(ctx, retention.Options{}); err != nil {
		t.Fatal(err)
	}
	// The second prune of the day grew the day's summary instead of adding
	// one: a processor checks about one filter a day, however often the
	// prune runs.
	sums, err = env.Store.PrunedSummaries(ctx, "ledger")
	if err != nil || len(sums) != 1 || !sums[0].Has("evt-old") || !sums[0].Has("evt-old-2") || sums[0].Has("evt-kept") {
		t.Fatalf("after a second prune the same day: %d summaries (%v), want one holding both runs' keys", len(sums), errText(err))
	}
	strict := s.proc(t, env.Env, "ledger", func(c *idem.Config[TTx]) { c.RefuseLate = true })
	r = strict.Process(ctx, idem.Message{ID: "evt-old"})
	if r.Outcome != idem.Expired || !errors.Is(r.Err, idem.ErrMarkerPruned) || !strings.Contains(r.Err.Error(), today) {
		t.Fatalf("late duplicate with RefuseLate: %v (%v), want Expired naming the day of the prune", r.Outcome, errText(r.Err))
	}
	if r := strict.Process(ctx, idem.Message{ID: "evt-old-2"}); r.Outcome != idem.Expired {
		t.Fatalf("a key the second prune removed, with RefuseLate: %v (%v), want Expired", r.Outcome, errText(r.Err))
	}
	if c := count(t, env.Effects, "ledger", "evt-old"); c != 2 {
		t.Fatalf("effects of evt-old = %d, want 2 (applied again once, flagged; then refused)", c)
	}
}

// checkRecordsHorizon: a consumer that guards with a horizon of its own
// records it when it checks its inbox, and the stored window then cannot be
// shortened below it without force; one that follows the stored window
// records nothing, so it never stands in the way.
func (s retentionSuite[TTx]) checkRecordsHorizon(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	own := s.proc(t, env.Env, "ledger", func(c *idem.Config[TTx]) { c.Horizon.Window = 10 * 24 * time.Hour })
	follows := s.proc(t, env.Env, "stats", nil)
	for _, p := range []*idem.Processor[TTx]{own, follows} {
		if err := p.Check(ctx); err != nil {
			t.Fatalf("%s: Check: %v", p.Consumer(), err)
		}
	}
	_, err := env.Store.SetWindow(ctx, 7*24*time.Hour, false)
	if err == nil || !strings.Contains(err.Error(), "ledger") || strings.Contains(err.Error(), "stats") {
		t.Fatalf("shortening below the horizon ledger checked in with: %v, want it refused naming ledger only", errText(err))
	}
	if _, err := env.Store.SetWindow(ctx, 10*24*time.Hour, false); err != nil {
		t.Fatalf("shortening to the recorded horizon: %v", err)
	}
}

// storedWindowJudgesHorizon: a process that never migrates (another
// service, a worker) builds its processor over a store with no window of
// its own; the stored window, not a default, judges its horizon before the
// first message: one it allows is accepted, a longer one refused by the
// stored number.
func (s retentionSuite[TTx]) storedWindowJudgesHorizon(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	if _, err := env.Store.SetWindow(ctx, 7*24*time.Hour, false); err != nil {
		t.Fatal(err)
	}
	other := env.Reopen(t, 0) // not migrated, no window of its own
	oenv := env.Env
	oenv.Store = other
	p := s.proc(t, oenv, "ledger", func(c *idem.Config[TTx]) { c.Horizon.Window = 5 * 24 * time.Hour })
	if err := p.Check(ctx); err != nil {
		t.Fatalf("a 5-day horizon under a stored 7-day window: %v", err)
	}
	want(t, p.Process(ctx, idem.Message{ID: idem.NewUUIDv7(time.Now()), Time: time.Now(), TimeSource: idem.TimeFromHeader}), idem.Applied)
	long := s.proc(t, oenv, "stats", func(c *idem.Config[TTx]) {
		c.Horizon.Window = 10 * 24 * time.Hour
		c.Retry.WaitUnavailable = 50 * time.Millisecond
	})
	if err := long.Check(ctx); !errors.Is(err, idem.ErrConfig) || !strings.Contains(err.Error(), "168h0m0s") {
		t.Fatalf("a 10-day horizon under a stored 7-day window: %v, want a configuration error naming the stored window", errText(err))
	}
	r := long.Process(ctx, idem.Message{ID: idem.NewUUIDv7(time.Now()), Time: time.Now(), TimeSource: idem.TimeFromHeader})
	if r.Outcome == idem.Applied || r.Outcome == idem.DeadLettered || long.Dispose(r).Action != idem.ActionHold {
		t.Fatalf("a message under the refused horizon: %v (%v), want it held, neither applied nor dead-lettered", r.Outcome, errText(r.Err))
	}
}

// shortenedWindowPrunesLate: processors guard with a shortened window from
// their next read of the settings, up to a minute later; the prune keeps
// markers for the old window meanwhile (ShrinkGrace), so a message the
// old guard still accepts never finds its marker gone.
func (s retentionSuite[TTx]) shortenedWindowPrunesLate(t *testing.T) {
	ctx := context.Background()
	env := s.open(t)
	if _, err := env.Store.SetWindow(ctx, 7*24*time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if set, err := env.Store.Settings(ctx); err != nil || set.Window != 7*24*time.Hour {
		t.Fatalf("guard right after shortening: %+v %v, want the new window at once", set, errText(err))
	}
	res, err := env.Store.Prune(ctx, retention.Options{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(res.Cutoff); age < defaultWindow-time.Hour {
		t.Fatalf("prune cut-off %v ago right after shortening, want the old window's %v until the processors caught up", age.Round(time.Hour), defaultWindow)
	}
}
