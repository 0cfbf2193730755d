// Package storetest is the conformance suite every idem inbox store must
// pass, against a real database: the unique constraint is the thing under
// test, so no fake will do. A store's test plugs itself in with a [Harness]
// and calls [Run].
package storetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// Env is one isolated database (a fresh schema or file) with a migrated
// inbox and an "effects" business table that has NO unique constraint, so a
// second application of a message would show as a second row.
type Env[TTx any] struct {
	Store idemstore.Store[TTx]
	// Apply writes one effect row inside tx.
	Apply func(ctx context.Context, tx TTx, consumer, key, messageID string) error
	// Effects counts committed effect rows of consumer (all keys when key is "").
	Effects func(ctx context.Context, consumer, key string) (int, error)
	// Markers counts committed inbox rows of consumer.
	Markers func(ctx context.Context, consumer string) (int, error)
	// Begin, Commit and Rollback a caller-owned transaction (for ProcessTx).
	Begin    func(ctx context.Context) (TTx, error)
	Commit   func(ctx context.Context, tx TTx) error
	Rollback func(ctx context.Context, tx TTx) error
}

// Harness describes a store to the suite.
type Harness[TTx any] struct {
	// Open returns a fresh Env for t; cleanup is registered on t. conns is
	// the size of the Env's connection pool: 0 is the store's usual pool,
	// n > 0 at most n connections (pgxpool MaxConns, database/sql
	// SetMaxOpenConns), for the suite's pool-of-one run (see [Run]). A
	// harness in this module limits the pool with internal/pooltest, which
	// also stops the test binary when a connection is waited for while
	// every one is held.
	Open func(t *testing.T, conns int) Env[TTx]
	// LockTimeout is true when the store bounds a claim's wait on a
	// concurrent holder of the same key (PostgreSQL does; SQLite serializes
	// writers instead).
	LockTimeout bool
	// OpenBehindFault, when set, returns an Env whose database connections
	// go through a network fault the suite can trigger (a proxy that stops
	// answering), so that outages are tested the way they happen: the
	// store's own errors, classified by the store. Stores without a network
	// (SQLite) leave it nil and skip those checks.
	// conns is as for Open.
	OpenBehindFault func(t *testing.T, conns int) (Env[TTx], Fault)
}

// Fault is a network fault between a store and its database.
type Fault interface {
	// Stop makes the database unreachable: open connections are cut and new
	// ones are never answered (a connect timeout must run out).
	Stop()
	// Freeze makes it silent: open connections stay open and carry nothing.
	Freeze()
	// Restore brings it back.
	Restore()
}

// Run runs the whole suite as subtests of t, twice: on the store's usual
// pool, and under PoolOfOne on a pool of one connection, or of N for a
// check that runs N transactions at once (N workers on a pool of N). No
// operation may ask its pool for a second connection while it holds one:
// on such a pool it would wait for itself (one connection per operation,
// docs/design.md). The pool-of-one run uses smaller message counts.
func Run[TTx any](t *testing.T, h Harness[TTx]) {
	runParallel(t, suite[TTx]{h: h}.checks())
	t.Run("PoolOfOne", func(t *testing.T) {
		t.Parallel()
		runParallel(t, suite[TTx]{h: h, pooled: true}.checks())
	})
}

// checks are the checks of Run.
func (s suite[TTx]) checks() []check {
	return []check{
		{"TwiceIsDuplicate", s.twiceIsDuplicate},
		{"ConcurrentSameMessage", s.concurrentSameMessage},
		{"OverlappingBatchesNoDeadlock", s.overlappingBatches},
		{"HandlerErrorLeavesNothing", s.handlerErrorLeavesNothing},
		{"RetriesExhausted", s.retriesExhausted},
		{"PoisonInBatch", s.poisonInBatch},
		{"MaxAttemptsCountsEveryRun", s.maxAttemptsCountsEveryRun},
		{"SlowHandlerIsTheMessagesFault", s.slowHandlerIsTheMessagesFault},
		{"CrashAfterCommit", s.crashAfterCommit},
		{"TwoConsumers", s.twoConsumers},
		{"BadInput", s.badInput},
		{"DuplicatesInsideBatch", s.duplicatesInsideBatch},
		{"BusinessKey", s.businessKey},
		{"KeyConflict", s.keyConflict},
		{"Natural", s.natural},
		{"ProcessTx", s.processTx},
		{"LockTimeout", s.lockTimeout},
		{"BatchHandler", s.batchHandler},
		{"RetryInBatchKeepsOrder", s.retryInBatchKeepsOrder},
		{"CommitUnknown", s.commitUnknown},
		{"CommitUnknownBatch", s.commitUnknownBatch},
		{"CrashAfterCommitBatch", s.crashAfterCommitBatch},
		{"UnavailableKeepsBudget", s.unavailableKeepsBudget},
		{"DefaultHorizon", s.defaultHorizon},
		{"OutageDuringFallback", s.outageDuringFallback},
		{"RealOutageKeepsBudget", s.realOutageKeepsBudget},
		{"SilentDatabaseIsBounded", s.silentDatabaseIsBounded},
	}
}

// check is one named check of a suite.
type check struct {
	name string
	fn   func(*testing.T)
}

// runParallel runs checks as parallel subtests of t.
func runParallel(t *testing.T, checks []check) {
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t)
		})
	}
}

type suite[TTx any] struct {
	h Harness[TTx]
	// pooled: every Env is opened on a pool of as many connections as
	// the check runs transactions at once.
	pooled bool
}

// conns is the pool size of a check that runs n transactions at once: n
// on the pool-of-one run, the store's usual pool (0) otherwise.
func (s suite[TTx]) conns(n int) int {
	if s.pooled {
		return n
	}
	return 0
}

// open is a fresh Env for a check that runs n transactions at once.
func (s suite[TTx]) open(t *testing.T, n int) Env[TTx] {
	t.Helper()
	return s.h.Open(t, s.conns(n))
}

// scale is full, or small on the pool-of-one run, which repeats the
// suite's checks and is kept short.
func (s suite[TTx]) scale(full, small int) int {
	if s.pooled {
		return small
	}
	return full
}

// proc builds a processor over env whose handler applies one effect per
// message, after calling before (when set) for fault injection.
func (s suite[TTx]) proc(t *testing.T, env Env[TTx], consumer string, before func(idem.Message) error, mod func(*idem.Config[TTx])) *idem.Processor[TTx] {
	t.Helper()
	cfg := &idem.Config[TTx]{
		Consumer: consumer,
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx TTx, m idem.Message) error {
			if before != nil {
				if err := before(m); err != nil {
					return err
				}
			}
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

func msg(id string) idem.Message {
	return idem.Message{ID: id, Body: []byte(`{"id":"` + id + `"}`)}
}

func count(t *testing.T, f func(context.Context, string, string) (int, error), consumer, key string) int {
	t.Helper()
	n, err := f(context.Background(), consumer, key)
	if err != nil {
		t.Fatalf("counting effects: %v", err)
	}
	return n
}

func markers[TTx any](t *testing.T, env Env[TTx], consumer string) int {
	t.Helper()
	n, err := env.Markers(context.Background(), consumer)
	if err != nil {
		t.Fatalf("counting markers: %v", err)
	}
	return n
}

func want(t *testing.T, r idem.Result, o idem.Outcome) {
	t.Helper()
	if r.Outcome != o {
		t.Fatalf("message %q: outcome %v, want %v (err: %v)", r.MessageID, r.Outcome, o, errText(r.Err))
	}
}

func (s suite[TTx]) twiceIsDuplicate(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	p := s.proc(t, env, "ledger", nil, nil)
	r1 := p.Process(ctx, msg("evt-42"))
	want(t, r1, idem.Applied)
	r2 := p.Process(ctx, msg("evt-42"))
	want(t, r2, idem.Duplicate)
	if r2.First == nil || r2.First.MessageID != "evt-42" || r2.First.ProcessedAt.IsZero() {
		t.Fatalf("duplicate should name the winning marker, got %+v", r2.First)
	}
	if r2.Conflict {
		t.Fatalf("same body reported as a key conflict")
	}
	if n := count(t, env.Effects, "ledger", ""); n != 1 {
		t.Fatalf("effects after two deliveries = %d, want 1", n)
	}
	if n := markers(t, env, "ledger"); n != 1 {
		t.Fatalf("markers = %d, want 1", n)
	}
}

func (s suite[TTx]) concurrentSameMessage(t *testing.T) {
	ctx := context.Background()
	n := s.scale(32, 4)
	env := s.open(t, n) // n workers on a pool of n
	p := s.proc(t, env, "ledger", nil, nil)
	var wg sync.WaitGroup
	results := make([]idem.Result, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = p.Process(ctx, msg("evt-race"))
		}()
	}
	close(start)
	wg.Wait()
	applied, dup := 0, 0
	for _, r := range results {
		switch r.Outcome {
		case idem.Applied:
			applied++
		case idem.Duplicate:
			dup++
		default:
			t.Errorf("unexpected outcome %v: %v", r.Outcome, errText(r.Err))
		}
	}
	if applied != 1 || dup != n-1 {
		t.Fatalf("applied=%d duplicate=%d, want 1 and %d", applied, dup, n-1)
	}
	if c := count(t, env.Effects, "ledger", ""); c != 1 {
		t.Fatalf("effects = %d, want 1", c)
	}
}

// overlappingBatches runs two batches over the same keys in opposite orders
// at once, many times. Without sorted claims they would take row locks in
// opposite orders and deadlock; retries are off so a deadlock would show.
//
// One batch waits for the other's locks for as long as the other's whole
// transaction takes, which on a loaded machine can outlast the default
// lock and transaction timeouts: those are raised far above it, so that
// the only way for a batch to fail here is the deadlock under test (which
// the database reports at once). A failed batch is named with its error.
// A store that serializes writers instead of locking rows (SQLite: no
// deadlock is possible) bounds the wait for the other batch with its own
// busy timeout, outside the processor's settings: there a batch that found
// the database busy and was tried again whole is what the contract asks.
func (s suite[TTx]) overlappingBatches(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 2) // two batches at once on a pool of two
	failed := &batchFailures{serialWriters: !s.h.LockTimeout}
	p := s.proc(t, env, "stock", nil, func(c *idem.Config[TTx]) {
		c.Retry.MaxAttempts = 1
		c.LockTimeout, c.TxTimeout = 5*time.Minute, 5*time.Minute
		c.Hooks = append(c.Hooks, failed)
	})
	rounds, size := s.scale(4, 2), s.scale(500, 200)
	applied := 0
	for r := range rounds {
		fwd := make([]idem.Message, size)
		rev := make([]idem.Message, size)
		for i := range size {
			fwd[i] = msg(fmt.Sprintf("r%02d-k%03d", r, i))
			rev[size-1-i] = fwd[i]
		}
		var a, b []idem.Result
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); a = p.ProcessBatch(ctx, fwd) }()
		go func() { defer wg.Done(); b = p.ProcessBatch(ctx, rev) }()
		wg.Wait()
		if errs := failed.take(); len(errs) > 0 {
			t.Fatalf("round %d: a batch's shared transaction failed (its messages then went one at a time): %v", r, errors.Join(errs...))
		}
		for _, res := range append(a, b...) {
			if res.Attempts != 1 && s.h.LockTimeout {
				t.Fatalf("round %d: %s took %d transactions, want 1 (outcome %v, err %v)", r, res.MessageID, res.Attempts, res.Outcome, errText(res.Err))
			}
			switch res.Outcome {
			case idem.Applied:
				applied++
			case idem.Duplicate:
			default:
				t.Fatalf("round %d: %s: outcome %v, want applied or duplicate: %v", r, res.MessageID, res.Outcome, errText(res.Err))
			}
		}
	}
	if applied != rounds*size {
		t.Fatalf("applied %d, want %d (each key once)", applied, rounds*size)
	}
	if c := count(t, env.Effects, "stock", ""); c != rounds*size {
		t.Fatalf("effects = %d, want %d", c, rounds*size)
	}
}

// batchFailures records why a batch's shared transaction failed.
type batchFailures struct {
	// serialWriters ignores a busy batch tried again whole.
	serialWriters bool
	mu            sync.Mutex
	errs          []error
}

func (f *batchFailures) OnAttempt(_ string, a idem.Attempt) {
	if !a.Batch || f.serialWriters && a.Class == idemstore.ClassBusy && a.Again {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	first := ""
	if len(a.MessageIDs) > 0 {
		first = a.MessageIDs[0]
	}
	f.errs = append(f.errs, fmt.Errorf("batch of %d from %s: try %d, %s: %w", len(a.MessageIDs), first, a.Try, className(a.Class), a.Err))
}

// className names an error class in failure messages.
func className(c idemstore.ErrorClass) string {
	switch c {
	case idemstore.ClassTransient:
		return "transient"
	case idemstore.ClassPermanent:
		return "permanent"
	case idemstore.ClassUnavailable:
		return "unavailable"
	case idemstore.ClassBusy:
		return "busy (lock timeout, deadlock or serialization failure)"
	case idemstore.ClassConfig:
		return "configuration"
	}
	return fmt.Sprintf("class %d", int(c))
}

// take returns the failures recorded since the last call.
func (f *batchFailures) take() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := f.errs
	f.errs = nil
	return errs
}

func (s suite[TTx]) handlerErrorLeavesNothing(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 2) // the attempt's transaction and the test's look from outside
	var calls atomic.Int32
	var seen []string
	p := s.proc(t, env, "ledger", func(m idem.Message) error {
		// What other transactions see while this attempt runs: the previous
		// failed attempts must have left neither marker nor effect.
		seen = append(seen, fmt.Sprintf("markers=%d effects=%d", markers(t, env, "ledger"), count(t, env.Effects, "ledger", "")))
		if calls.Add(1) <= 2 {
			return errors.New("downstream unavailable")
		}
		return nil
	}, nil)
	r := p.Process(ctx, msg("evt-1"))
	want(t, r, idem.Applied)
	if r.Attempts != 3 {
		t.Fatalf("attempts = %d, want 3", r.Attempts)
	}
	for i, s := range seen {
		if s != "markers=0 effects=0" {
			t.Fatalf("attempt %d saw %s left behind by a failed attempt", i+1, s)
		}
	}
	if c := count(t, env.Effects, "ledger", ""); c != 1 {
		t.Fatalf("effects = %d, want 1", c)
	}
}

func (s suite[TTx]) retriesExhausted(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	p := s.proc(t, env, "ledger", func(idem.Message) error { return errors.New("always down") },
		func(c *idem.Config[TTx]) { c.Retry.MaxAttempts = 3 })
	r := p.Process(ctx, msg("evt-1"))
	want(t, r, idem.DeadLettered)
	if !errors.Is(r.Err, idem.ErrRetriesExhausted) || r.Attempts != 3 {
		t.Fatalf("err = %v attempts = %d, want retries exhausted after 3", errText(r.Err), r.Attempts)
	}
	if markers(t, env, "ledger") != 0 || count(t, env.Effects, "ledger", "") != 0 {
		t.Fatalf("a failed message left a marker or an effect")
	}
}

func (s suite[TTx]) poisonInBatch(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	p := s.proc(t, env, "ledger", func(m idem.Message) error {
		switch m.ID {
		case "evt-04":
			return idem.Permanent(errors.New("unknown merchant"))
		case "evt-07":
			panic("nil map in handler")
		}
		return nil
	}, nil)
	var batch []idem.Message
	for i := range 10 {
		batch = append(batch, msg(fmt.Sprintf("evt-%02d", i)))
	}
	rs := p.ProcessBatch(ctx, batch)
	for i, r := range rs {
		if r.MessageID != batch[i].ID {
			t.Fatalf("result %d is for %s, want %s (results must be in message order)", i, r.MessageID, batch[i].ID)
		}
		if i == 4 || i == 7 {
			want(t, r, idem.DeadLettered)
			if r.Err == nil || !idem.IsPermanent(r.Err) {
				t.Fatalf("poison %s: err %v should be permanent with a reason", r.MessageID, errText(r.Err))
			}
			continue
		}
		want(t, r, idem.Applied)
	}
	if c := count(t, env.Effects, "ledger", ""); c != 8 {
		t.Fatalf("effects = %d, want 8", c)
	}
	if m := markers(t, env, "ledger"); m != 8 {
		t.Fatalf("markers = %d, want 8 (no marker for poison)", m)
	}
	if !strings.Contains(rs[4].Err.Error(), "unknown merchant") || !strings.Contains(rs[7].Err.Error(), "panicked") {
		t.Fatalf("reasons lost: %v / %v", errText(rs[4].Err), errText(rs[7].Err))
	}
}

func (s suite[TTx]) crashAfterCommit(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	var crashed atomic.Bool
	p := s.proc(t, env, "invoices", nil, func(c *idem.Config[TTx]) {
		c.Faults = func(_ context.Context, pt idem.FaultPoint, _ []idem.Message) error {
			if pt == idem.AfterCommit && crashed.CompareAndSwap(false, true) {
				return errors.New("process killed before ack")
			}
			return nil
		}
	})
	r1 := p.Process(ctx, msg("evt-7f3a"))
	want(t, r1, idem.Retry) // not acked: the broker will deliver it again
	if c := count(t, env.Effects, "invoices", ""); c != 1 {
		t.Fatalf("effects after commit = %d, want 1", c)
	}
	r2 := p.Process(ctx, msg("evt-7f3a"))
	want(t, r2, idem.Duplicate)
	if c := count(t, env.Effects, "invoices", ""); c != 1 {
		t.Fatalf("effects after redelivery = %d, want 1", c)
	}
}

func (s suite[TTx]) twoConsumers(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	a := s.proc(t, env, "invoices", nil, nil)
	b := s.proc(t, env, "stats", nil, nil)
	for range 2 {
		a.Process(ctx, msg("evt-1"))
		b.Process(ctx, msg("evt-1"))
	}
	if count(t, env.Effects, "invoices", "") != 1 || count(t, env.Effects, "stats", "") != 1 {
		t.Fatalf("each consumer must apply the message once")
	}
}

func (s suite[TTx]) badInput(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	var called atomic.Int32
	p := s.proc(t, env, "ledger", func(idem.Message) error { called.Add(1); return nil }, func(c *idem.Config[TTx]) {
		c.Key = func(m idem.Message) (string, error) {
			if k, ok := m.Headers["key"]; ok {
				return k, nil
			}
			return m.ID, nil
		}
	})
	withKey := func(k string) idem.Message { m := msg("evt-1"); m.Headers = map[string]string{"key": k}; return m }
	cases := []struct {
		name string
		m    idem.Message
		is   error
	}{
		{"no message ID", idem.Message{Body: []byte("{}")}, idem.ErrNoMessageID},
		{"empty key", withKey(""), idem.ErrBadKey},
		{"invalid UTF-8", withKey("inv\xff\xfe"), idem.ErrBadKey},
		{"NUL byte", withKey("a\x00b"), idem.ErrBadKey},
		{"key too long", withKey(strings.Repeat("k", idem.MaxKeyLen+1)), idem.ErrBadKey},
		{"ID too long", msg(strings.Repeat("i", idem.MaxKeyLen+1)), idem.ErrBadKey},
	}
	for _, c := range cases {
		r := p.Process(ctx, c.m)
		if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, c.is) {
			t.Errorf("%s: outcome %v err %v, want dead-lettered with %v", c.name, r.Outcome, errText(r.Err), c.is)
		}
		// In a batch too, and without sinking a good neighbour.
		rs := p.ProcessBatch(ctx, []idem.Message{c.m, msg("evt-good-" + c.name)})
		if rs[0].Outcome != idem.DeadLettered || !rs[1].Outcome.Acked() {
			t.Errorf("%s in a batch: %v / %v", c.name, rs[0].Outcome, rs[1].Outcome)
		}
	}
	if int(called.Load()) != len(cases) {
		t.Fatalf("handler ran %d times, want %d (only the good neighbours)", called.Load(), len(cases))
	}
	if m := markers(t, env, "ledger"); m != len(cases) {
		t.Fatalf("markers = %d, want %d: bad input must write nothing", m, len(cases))
	}
	if k := strings.Repeat("k", idem.MaxKeyLen); p.Process(ctx, withKey(k)).Outcome != idem.Applied {
		t.Fatalf("a key of exactly %d bytes must be accepted", idem.MaxKeyLen)
	}
}

func (s suite[TTx]) duplicatesInsideBatch(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	p := s.proc(t, env, "ledger", nil, nil)
	rs := p.ProcessBatch(ctx, []idem.Message{msg("a"), msg("b"), msg("a"), msg("c"), msg("b")})
	got := []idem.Outcome{}
	for _, r := range rs {
		got = append(got, r.Outcome)
	}
	wantOut := []idem.Outcome{idem.Applied, idem.Applied, idem.Duplicate, idem.Applied, idem.Duplicate}
	if fmt.Sprint(got) != fmt.Sprint(wantOut) {
		t.Fatalf("outcomes %v, want %v", got, wantOut)
	}
	if c := count(t, env.Effects, "ledger", ""); c != 3 {
		t.Fatalf("effects = %d, want 3", c)
	}
}

// businessKey dedupes two different messages that ask for the same effect:
// the incident's invoice per (customer, period).
func (s suite[TTx]) businessKey(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	type renewed struct {
		Customer string `json:"customer_id"`
		Period   string `json:"period"`
	}
	p := s.proc(t, env, "invoices", nil, func(c *idem.Config[TTx]) {
		c.Key = idem.JSONKey(func(e renewed) string { return "invoice:" + e.Customer + ":" + e.Period })
		c.Handler = func(ctx context.Context, tx TTx, m idem.Message) error {
			return env.Apply(ctx, tx, "invoices", "cus-8421:2026-09", m.ID)
		}
	})
	body := []byte(`{"customer_id":"cus-8421","period":"2026-09"}`)
	want(t, p.Process(ctx, idem.Message{ID: "msg-1", Body: body}), idem.Applied)
	want(t, p.Process(ctx, idem.Message{ID: "msg-2", Body: body}), idem.Duplicate)
	if c := count(t, env.Effects, "invoices", ""); c != 1 {
		t.Fatalf("invoices = %d, want 1", c)
	}
	r := p.Process(ctx, idem.Message{ID: "msg-3", Body: []byte("not json")})
	if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, idem.ErrBadKey) {
		t.Fatalf("undecodable body: %v %v, want dead-lettered", r.Outcome, errText(r.Err))
	}
}

func (s suite[TTx]) keyConflict(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	p := s.proc(t, env, "ledger", nil, nil)
	want(t, p.Process(ctx, idem.Message{ID: "evt-1", Body: []byte(`{"amount":12500}`)}), idem.Applied)
	r := p.Process(ctx, idem.Message{ID: "evt-1", Body: []byte(`{"amount":99999}`)})
	want(t, r, idem.Duplicate)
	if !r.Conflict {
		t.Fatalf("a reused key with another body must be flagged")
	}
}

func (s suite[TTx]) natural(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	p := s.proc(t, env, "stats", nil, func(c *idem.Config[TTx]) { c.Natural = true; c.Key = nil })
	want(t, p.Process(ctx, msg("evt-1")), idem.Applied)
	want(t, p.Process(ctx, msg("evt-1")), idem.Applied)
	if m := markers(t, env, "stats"); m != 0 {
		t.Fatalf("natural consumer wrote %d markers", m)
	}
	if c := count(t, env.Effects, "stats", ""); c != 2 {
		t.Fatalf("natural consumer: handler effects %d, want 2 (it runs every time)", c)
	}
	if r := p.Process(ctx, idem.Message{}); r.Outcome != idem.DeadLettered {
		t.Fatalf("natural consumer must still refuse a message without ID, got %v", r.Outcome)
	}
}

// processTx runs messages in transactions the caller owns. On the
// pool-of-one run the caller's transaction holds the pool's only
// connection, so nothing the processor reads (the stored settings, the
// pruned-key summaries) may ask for another: the first call of a fresh
// processor, and calls after one whose handler failed, apply their
// messages.
func (s suite[TTx]) processTx(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	errRefused := errors.New("handler refuses")
	p := s.proc(t, env, "ledger", func(m idem.Message) error {
		if m.ID == "evt-refused" {
			return errRefused
		}
		return nil
	}, nil)
	run := func(id string, commit bool) (idem.Result, error) {
		tx, err := env.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r, perr := p.ProcessTx(ctx, tx, msg(id))
		if perr != nil || !commit {
			if err := env.Rollback(ctx, tx); err != nil {
				t.Fatal(err)
			}
			return r, perr
		}
		return r, env.Commit(ctx, tx)
	}
	applied := func(id string, commit bool) idem.Result {
		t.Helper()
		r, err := run(id, commit)
		if err != nil {
			t.Fatalf("ProcessTx %s: %v", id, err)
		}
		return r
	}
	want(t, applied("evt-1", false), idem.Applied)
	if count(t, env.Effects, "ledger", "") != 0 || markers(t, env, "ledger") != 0 {
		t.Fatalf("rolled-back caller transaction left an effect or marker")
	}
	want(t, applied("evt-1", true), idem.Applied)
	want(t, applied("evt-1", true), idem.Duplicate)
	if _, err := run("evt-refused", true); !errors.Is(err, errRefused) {
		t.Fatalf("a failing handler: ProcessTx error %s, want the handler's", errText(err))
	}
	want(t, applied("evt-2", true), idem.Applied)
	want(t, applied("evt-3", true), idem.Applied)
	if c := count(t, env.Effects, "ledger", ""); c != 3 {
		t.Fatalf("effects = %d, want 3", c)
	}
}

// lockTimeout holds a claim open in one transaction and shows that a second
// claim of the same key gives up after the lock timeout instead of hanging,
// then becomes a Duplicate once the holder commits.
func (s suite[TTx]) lockTimeout(t *testing.T) {
	if !s.h.LockTimeout {
		t.Skip("store serializes writers; no lock timeout to test")
	}
	ctx := context.Background()
	env := s.open(t, 2) // the holder's transaction and the processor's
	p := s.proc(t, env, "ledger", nil, func(c *idem.Config[TTx]) {
		c.LockTimeout = 100 * time.Millisecond
		c.Retry.MaxAttempts = 1
		c.Retry.WaitUnavailable = 300 * time.Millisecond
	})
	holder, err := env.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A failed check must not leave the holder open: the pool's close
	// would wait for it.
	defer func() { _ = env.Rollback(context.WithoutCancel(ctx), holder) }()
	if _, err := p.ProcessTx(ctx, holder, msg("evt-held")); err != nil {
		t.Fatal(err)
	}
	// The key is held by a twin: its outcome decides this message's, so the
	// wait is not the message's fault. It ends blameless, never in a dead
	// letter, even with a budget of one.
	r := p.Process(ctx, msg("evt-held"))
	if r.Outcome != idem.Retry || !r.Blameless || !errors.Is(r.Err, idem.ErrBusy) || r.Attempts < 2 {
		t.Fatalf("claim behind a held lock: %v after %d attempts (%v, blameless %v), want a blameless Retry wrapping ErrBusy after several tries", r.Outcome, r.Attempts, errText(r.Err), r.Blameless)
	}
	if err := env.Commit(ctx, holder); err != nil {
		t.Fatal(err)
	}
	want(t, p.Process(ctx, msg("evt-held")), idem.Duplicate)
}

// batchHandler checks Config.HandleBatch: one call per transaction with only
// the fresh messages, in message order; a failing batch falls back to one
// message at a time so the poison one is isolated.
func (s suite[TTx]) batchHandler(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	var mu sync.Mutex
	var calls [][]string
	p := s.proc(t, env, "ledger", nil, func(c *idem.Config[TTx]) {
		c.Handler = nil
		c.HandleBatch = func(ctx context.Context, tx TTx, msgs []idem.Message) error {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.ID
				if m.ID == "poison" {
					return idem.Permanent(errors.New("cannot parse amount"))
				}
				if err := env.Apply(ctx, tx, "ledger", m.ID, m.ID); err != nil {
					return err
				}
			}
			mu.Lock()
			calls = append(calls, ids)
			mu.Unlock()
			return nil
		}
	})
	want(t, p.Process(ctx, msg("b")), idem.Applied)
	rs := p.ProcessBatch(ctx, []idem.Message{msg("d"), msg("b"), msg("a"), msg("c")})
	for _, r := range rs {
		if !r.Outcome.Acked() {
			t.Fatalf("%s: %v %v", r.MessageID, r.Outcome, errText(r.Err))
		}
	}
	if got := fmt.Sprint(calls); got != "[[b] [d a c]]" {
		t.Fatalf("batch handler calls %s, want [[b] [d a c]] (fresh only, message order)", got)
	}
	rs = p.ProcessBatch(ctx, []idem.Message{msg("e"), msg("poison"), msg("f")})
	if rs[0].Outcome != idem.Applied || rs[1].Outcome != idem.DeadLettered || rs[2].Outcome != idem.Applied {
		t.Fatalf("poison in a batch handler: %v %v %v", rs[0].Outcome, rs[1].Outcome, rs[2].Outcome)
	}
	if c := count(t, env.Effects, "ledger", ""); c != 6 {
		t.Fatalf("effects = %d, want 6", c)
	}
}

// retryInBatchKeepsOrder: when one message of a batch must be retried,
// ProcessBatch still applies its neighbours (a failing message cannot sink
// them), while ProcessBatchInOrder applies none of the messages after it
// ahead of it.
func (s suite[TTx]) retryInBatchKeepsOrder(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	f := &faultyStore[TTx]{Store: env.Store}
	fenv := env
	fenv.Store = f
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	runs := map[string]int{}
	// A "b" message fails the batch it is in, then, tried alone, commits
	// but loses the commit's answer: the one Retry that is the message's
	// own (counted) and not a dead letter.
	p := s.proc(t, fenv, "ledger", func(m idem.Message) error {
		if !strings.HasPrefix(m.ID, "b") || !down.Load() {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		runs[m.ID]++
		if runs[m.ID] == 1 {
			return errors.New("downstream unavailable")
		}
		f.loseNextCommitAnswer.Store(true)
		return nil
	}, func(c *idem.Config[TTx]) { c.Retry.MaxAttempts = 3 })

	rs := p.ProcessBatch(ctx, []idem.Message{msg("a1"), msg("b1"), msg("c1")})
	if rs[0].Outcome != idem.Applied || rs[1].Outcome != idem.Retry || rs[2].Outcome != idem.Applied {
		t.Fatalf("ProcessBatch: %v %v %v, want applied retry applied", rs[0].Outcome, rs[1].Outcome, rs[2].Outcome)
	}

	rs = p.ProcessBatchInOrder(ctx, []idem.Message{msg("a2"), msg("b2"), msg("c2")})
	if rs[0].Outcome != idem.Applied || rs[1].Outcome != idem.Retry || rs[2].Outcome != idem.Retry {
		t.Fatalf("ProcessBatchInOrder: %v %v %v, want applied retry retry", rs[0].Outcome, rs[1].Outcome, rs[2].Outcome)
	}
	if !errors.Is(rs[2].Err, idem.ErrNotAttempted) {
		t.Fatalf("message after the retried one: %v, want ErrNotAttempted", errText(rs[2].Err))
	}
	if c := count(t, env.Effects, "ledger", "c2"); c != 0 {
		t.Fatalf("c2 was applied before b2")
	}
	// A message that is bad input behind the stop is not dead-lettered (nor
	// counted) yet either: it was not reached, and will come again.
	rs = p.ProcessBatchInOrder(ctx, []idem.Message{msg("b3"), {Body: []byte("{}")}})
	if rs[0].Outcome != idem.Retry || rs[1].Outcome != idem.Retry || !errors.Is(rs[1].Err, idem.ErrNotAttempted) || !rs[1].Blameless {
		t.Fatalf("bad input behind a retried message: %v %v (%v)", rs[0].Outcome, rs[1].Outcome, errText(rs[1].Err))
	}
	down.Store(false)
	rs = p.ProcessBatchInOrder(ctx, []idem.Message{msg("b2"), msg("c2")})
	if rs[0].Outcome != idem.Duplicate || rs[1].Outcome != idem.Applied {
		t.Fatalf("redelivery: %v %v (%v %v)", rs[0].Outcome, rs[1].Outcome, errText(rs[0].Err), errText(rs[1].Err))
	}
	if c := count(t, env.Effects, "ledger", ""); c != 7 {
		t.Fatalf("effects = %d, want 7 (a1 b1 c1 a2 b2 b3 c2, each once)", c)
	}
}

// faultyStore wraps a real store to inject what is hard to cause on demand:
// a COMMIT that committed but whose answer was lost, and a database that
// cannot be reached for a while.
type faultyStore[TTx any] struct {
	idemstore.Store[TTx]
	loseCommitAnswer atomic.Bool
	// loseNextCommitAnswer loses the answer of the next commit only.
	loseNextCommitAnswer atomic.Bool
	beginDown            atomic.Int32 // Begin fails this many more times
}

var errDown = errors.New("injected: connection refused")

func (f *faultyStore[TTx]) Begin(ctx context.Context) (TTx, error) {
	if f.beginDown.Add(-1) >= 0 {
		var zero TTx
		return zero, errDown
	}
	return f.Store.Begin(ctx)
}

func (f *faultyStore[TTx]) Commit(ctx context.Context, tx TTx) error {
	err := f.Store.Commit(ctx, tx)
	if err == nil && (f.loseCommitAnswer.Load() || f.loseNextCommitAnswer.CompareAndSwap(true, false)) {
		return fmt.Errorf("%w: injected: connection lost after COMMIT was sent", idemstore.ErrCommitUnknown)
	}
	return err
}

func (f *faultyStore[TTx]) Classify(err error) idemstore.ErrorClass {
	if errors.Is(err, errDown) {
		return idemstore.ClassUnavailable
	}
	return f.Store.Classify(err)
}

func (s suite[TTx]) faulty(t *testing.T, mod func(*idem.Config[TTx])) (Env[TTx], *faultyStore[TTx], *idem.Processor[TTx]) {
	env := s.open(t, 1)
	f := &faultyStore[TTx]{Store: env.Store}
	fenv := env
	fenv.Store = f
	return env, f, s.proc(t, fenv, "ledger", nil, mod)
}

// commitUnknown: a commit whose outcome is unknown is never reported as
// Applied, and is not retried in process; the redelivery finds the marker.
func (s suite[TTx]) commitUnknown(t *testing.T) {
	ctx := context.Background()
	env, f, p := s.faulty(t, nil)
	f.loseCommitAnswer.Store(true)
	r := p.Process(ctx, msg("evt-1"))
	if r.Outcome != idem.Retry || !errors.Is(r.Err, idem.ErrCommitUnknown) || r.Attempts != 1 || r.Blameless {
		t.Fatalf("lost commit answer: %v after %d attempts (%v, blameless %v), want Retry after 1 with ErrCommitUnknown, counted against the message",
			r.Outcome, r.Attempts, r.Err, r.Blameless)
	}
	f.loseCommitAnswer.Store(false)
	want(t, p.Process(ctx, msg("evt-1")), idem.Duplicate)
	if c := count(t, env.Effects, "ledger", ""); c != 1 {
		t.Fatalf("effects = %d, want 1", c)
	}
}

// commitUnknownBatch: when a batch's commit outcome is unknown, its
// messages are tried one by one: each finds its marker (Duplicate, never
// Applied) or redoes its work, so a slow message is charged alone instead of
// its neighbours with it.
func (s suite[TTx]) commitUnknownBatch(t *testing.T) {
	ctx := context.Background()
	env, f, p := s.faulty(t, nil)
	f.loseCommitAnswer.Store(true)
	batch := []idem.Message{msg("a"), msg("b"), msg("c")}
	for _, r := range p.ProcessBatch(ctx, batch) {
		if r.Outcome != idem.Duplicate || r.Attempts != 2 {
			t.Fatalf("%s: %v after %d transactions (%v), want Duplicate after 2: the batch committed, its answer was lost", r.MessageID, r.Outcome, r.Attempts, errText(r.Err))
		}
	}
	f.loseCommitAnswer.Store(false)
	for _, r := range p.ProcessBatch(ctx, batch) {
		want(t, r, idem.Duplicate)
	}
	if c := count(t, env.Effects, "ledger", ""); c != 3 {
		t.Fatalf("effects = %d, want 3", c)
	}
}

// crashAfterCommitBatch: a crash between a batch's commit and its ack
// leaves every message to redelivery, which finds them all applied.
func (s suite[TTx]) crashAfterCommitBatch(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	var crashed atomic.Bool
	p := s.proc(t, env, "ledger", nil, func(c *idem.Config[TTx]) {
		c.Faults = func(_ context.Context, pt idem.FaultPoint, _ []idem.Message) error {
			if pt == idem.AfterCommit && crashed.CompareAndSwap(false, true) {
				return errors.New("process killed before ack")
			}
			return nil
		}
	})
	batch := []idem.Message{msg("a"), msg("b")}
	for _, r := range p.ProcessBatch(ctx, batch) {
		want(t, r, idem.Retry)
	}
	for _, r := range p.ProcessBatch(ctx, batch) {
		want(t, r, idem.Duplicate)
	}
	if c := count(t, env.Effects, "ledger", ""); c != 2 {
		t.Fatalf("effects = %d, want 2", c)
	}
}

// unavailableKeepsBudget: while the database cannot be reached the
// processor waits without spending the message's attempts (an outage is
// not the message's fault), up to RetryPolicy.WaitUnavailable.
func (s suite[TTx]) unavailableKeepsBudget(t *testing.T) {
	ctx := context.Background()
	env, p, down, up := s.outage(t, nil, func(c *idem.Config[TTx]) { c.Retry.MaxAttempts = 1 })
	want(t, p.Process(ctx, msg("evt-warm")), idem.Applied)
	down()
	restored := make(chan struct{})
	go func() {
		defer close(restored)
		time.Sleep(1500 * time.Millisecond) // past a connect timeout of 1s
		up()
	}()
	r := p.Process(ctx, msg("evt-1"))
	<-restored
	if r.Outcome != idem.Applied || r.Attempts < 2 {
		t.Fatalf("after a short outage: %v after %d runs (%v), want Applied after several with a budget of 1", r.Outcome, r.Attempts, errText(r.Err))
	}
	_, p, down, _ = s.outage(t, nil, func(c *idem.Config[TTx]) { c.Retry.WaitUnavailable = 30 * time.Millisecond })
	want(t, p.Process(ctx, msg("evt-warm")), idem.Applied)
	down()
	r = p.Process(ctx, msg("evt-2"))
	if r.Outcome != idem.Retry || !errors.Is(r.Err, idem.ErrUnavailable) || !r.Blameless {
		t.Fatalf("during a long outage: %v (%v, blameless %v), want a blameless Retry with ErrUnavailable", r.Outcome, errText(r.Err), r.Blameless)
	}
	// A batch waits for the database once, as a whole, rather than once per
	// message after falling back to one at a time.
	for _, r := range p.ProcessBatch(ctx, []idem.Message{msg("evt-b1"), msg("evt-b2"), msg("evt-b3")}) {
		if r.Outcome != idem.Retry || !errors.Is(r.Err, idem.ErrBatchFailed) || !errors.Is(r.Err, idem.ErrUnavailable) || !r.Blameless {
			t.Fatalf("batch during a long outage: %s %v (%v), want a blameless Retry for the whole batch", r.MessageID, r.Outcome, errText(r.Err))
		}
	}
	if c := count(t, env.Effects, "ledger", ""); c != 2 {
		t.Fatalf("effects = %d, want 2", c)
	}
	// A real "connection refused" from the handler (its payment gateway is
	// down) is the message's failure: it spends attempts, ends in the
	// dead-letter path once they are spent, and does not wait.
	p = s.proc(t, s.open(t, 1), "ledger", nil, func(c *idem.Config[TTx]) {
		c.Retry.MaxAttempts = 2
		c.Handler = func(ctx context.Context, _ TTx, _ idem.Message) error {
			conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:1")
			if err == nil {
				_ = conn.Close()
				return errors.New("port 1 answered")
			}
			return fmt.Errorf("calling the payment gateway: %w", err)
		}
	})
	r = p.Process(ctx, msg("evt-3"))
	if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, idem.ErrRetriesExhausted) || r.Attempts != 2 || r.Blameless {
		t.Fatalf("handler's own unreachable service: %v after %d (%v, blameless %v), want a dead letter after 2 with ErrRetriesExhausted",
			r.Outcome, r.Attempts, r.Err, r.Blameless)
	}
}

// outage opens an env whose database the test can take down and bring
// back: through the harness's network fault when the store has a network
// (the store's own errors, classified by the store), else (SQLite, a file)
// by failing BEGIN with an error the wrapper calls unavailable, the only
// way to have a file-backed database "unreachable".
func (s suite[TTx]) outage(t *testing.T, before func(idem.Message) error, mod func(*idem.Config[TTx])) (env Env[TTx], p *idem.Processor[TTx], down, up func()) {
	t.Helper()
	if s.h.OpenBehindFault != nil {
		env, fault := s.h.OpenBehindFault(t, s.conns(1))
		return env, s.proc(t, env, "ledger", before, mod), fault.Stop, fault.Restore
	}
	env = s.open(t, 1)
	f := &faultyStore[TTx]{Store: env.Store}
	fenv := env
	fenv.Store = f
	return env, s.proc(t, fenv, "ledger", before, mod), func() { f.beginDown.Store(1 << 30) }, func() { f.beginDown.Store(0) }
}

// defaultHorizon pins DESIGN 8 under the default configuration: a store
// that prunes offers its horizon, the processor adopts it, and a replay
// older than the window is Expired, not applied.
func (s suite[TTx]) defaultHorizon(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	window := env.Store.Window()
	if window == 0 {
		t.Skip("store has no retention window")
	}
	p := s.proc(t, env, "ledger", nil, nil)
	old := msg("evt-replayed")
	old.Time = time.Now().Add(-window - time.Hour)
	if r := p.Process(ctx, old); r.Outcome != idem.Expired || !errors.Is(r.Err, idem.ErrExpired) {
		t.Fatalf("replay older than the window: %v (%v), want Expired", r.Outcome, errText(r.Err))
	}
	recent := msg("evt-recent")
	recent.Time = time.Now().Add(-time.Hour)
	want(t, p.Process(ctx, recent), idem.Applied)
	if c := count(t, env.Effects, "ledger", ""); c != 1 {
		t.Fatalf("effects = %d, want 1", c)
	}
}

// countObserver counts the results a processor reports, by outcome.
type countObserver struct {
	mu sync.Mutex
	n  map[idem.Outcome]int
}

func (o *countObserver) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[idem.Outcome]int{}
	}
	o.n[r.Outcome]++
}

// outageDuringFallback: a batch falls back to one message at a time (a
// poison message) and the database goes down meanwhile. The first message
// that meets the outage waits for it; the ones after it are not tried (they
// would only wait in turn) nor reported, and are blameless, so no budget is
// spent on them.
func (s suite[TTx]) outageDuringFallback(t *testing.T) {
	ctx := context.Background()
	obs := &countObserver{}
	var poisoned atomic.Int32
	var down func()
	_, p, d, _ := s.outage(t, func(m idem.Message) error {
		if m.ID == "poison" {
			if poisoned.Add(1) == 2 { // its own try, after the batch's
				down()
			}
			return idem.Permanent(errors.New("cannot parse amount"))
		}
		return nil
	}, func(c *idem.Config[TTx]) {
		c.Retry.WaitUnavailable = 30 * time.Millisecond
		c.Hooks = append(c.Hooks, obs)
	})
	down = d
	rs := p.ProcessBatch(ctx, []idem.Message{msg("poison"), msg("a"), msg("b"), msg("c")})
	if rs[0].Outcome != idem.DeadLettered {
		t.Fatalf("poison: %v (%v)", rs[0].Outcome, errText(rs[0].Err))
	}
	if rs[1].Outcome != idem.Retry || !errors.Is(rs[1].Err, idem.ErrUnavailable) || !rs[1].Blameless {
		t.Fatalf("first message after the outage began: %v (%v, blameless %v), want a blameless Retry with ErrUnavailable", rs[1].Outcome, errText(rs[1].Err), rs[1].Blameless)
	}
	for _, r := range rs[2:] {
		if r.Outcome != idem.Retry || !errors.Is(r.Err, idem.ErrNotAttempted) || !r.Blameless {
			t.Fatalf("%s: %v (%v, blameless %v), want a blameless Retry, not attempted", r.MessageID, r.Outcome, errText(r.Err), r.Blameless)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.n[idem.DeadLettered] != 1 || obs.n[idem.Retry] != 1 || len(obs.n) != 2 {
		t.Fatalf("observed %v, want one dead letter and one retry: messages not attempted are not reported", obs.n)
	}
}

// realOutageKeepsBudget is unavailableKeepsBudget with a real outage: the
// database stops answering (connections cut, reconnects hang until their
// connect timeout). The store's own classification must make it an outage:
// the message keeps its whole budget of one attempt, is held blameless while
// the database is down, and is applied once it is back.
func (s suite[TTx]) realOutageKeepsBudget(t *testing.T) {
	if s.h.OpenBehindFault == nil {
		t.Skip("store has no network to fail")
	}
	ctx := context.Background()
	env, fault := s.h.OpenBehindFault(t, s.conns(1))
	p := s.proc(t, env, "ledger", nil, func(c *idem.Config[TTx]) {
		c.Retry.MaxAttempts = 1
		c.Retry.WaitUnavailable = 1500 * time.Millisecond
	})
	want(t, p.Process(ctx, msg("evt-warm")), idem.Applied)
	fault.Stop()
	r := p.Process(ctx, msg("evt-1"))
	if r.Outcome != idem.Retry || !r.Blameless || !errors.Is(r.Err, idem.ErrUnavailable) {
		t.Fatalf("database stopped: %v (%v, blameless %v), want a blameless Retry wrapping ErrUnavailable", r.Outcome, errText(r.Err), r.Blameless)
	}
	if d := p.Dispose(r); d.Action != idem.ActionHold {
		t.Fatalf("database stopped: disposition %v, want hold", d.Action)
	}
	fault.Restore()
	want(t, p.Process(ctx, msg("evt-1")), idem.Applied)
	if c := count(t, env.Effects, "ledger", ""); c != 2 {
		t.Fatalf("effects = %d, want 2", c)
	}
}

// silentDatabaseIsBounded: a database that goes silent mid-transaction (a
// half-open connection) cannot hold a worker past the transaction timeout;
// the try fails, is not the message's fault when it was the store's step,
// and the message is applied once the database answers again.
func (s suite[TTx]) silentDatabaseIsBounded(t *testing.T) {
	if s.h.OpenBehindFault == nil {
		t.Skip("store has no network to fail")
	}
	ctx := context.Background()
	env, fault := s.h.OpenBehindFault(t, s.conns(1))
	p := s.proc(t, env, "ledger", nil, func(c *idem.Config[TTx]) {
		c.Retry.MaxAttempts = 1
		c.Retry.WaitUnavailable = 2 * time.Second
		c.TxTimeout = 300 * time.Millisecond
		c.CommitTimeout = 300 * time.Millisecond
	})
	want(t, p.Process(ctx, msg("evt-warm")), idem.Applied)
	fault.Freeze()
	done := make(chan idem.Result, 1)
	go func() { done <- p.Process(ctx, msg("evt-1")) }()
	select {
	case r := <-done:
		if r.Outcome == idem.DeadLettered || r.Outcome == idem.Applied {
			t.Fatalf("silent database: %v (%v), want it held, never dead-lettered", r.Outcome, errText(r.Err))
		}
		if !r.Blameless {
			t.Fatalf("silent database: %v (%v) counted against the message", r.Outcome, errText(r.Err))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a silent database held Process past every deadline")
	}
	fault.Restore()
	// The message is delivered again to a consumer with the default
	// deadlines: the 300 ms above bound the silent database, and on a
	// loaded machine a live one can take longer than that, which is the
	// message's own failure and would spend its one attempt.
	again := s.proc(t, env, "ledger", nil, nil)
	r := again.Process(ctx, msg("evt-1"))
	if r.Outcome != idem.Applied && r.Outcome != idem.Duplicate {
		t.Fatalf("after the database answered again: %v (%v)", r.Outcome, errText(r.Err))
	}
	if c := count(t, env.Effects, "ledger", "evt-1"); c != 1 {
		t.Fatalf("effects of evt-1 = %d, want 1", c)
	}
}

// maxAttemptsCountsEveryRun pins the one meaning of RetryPolicy.MaxAttempts:
// how many times the handler runs for one message before it is
// dead-lettered — alone, or first inside a batch whose shared try it failed.
func (s suite[TTx]) maxAttemptsCountsEveryRun(t *testing.T) {
	ctx := context.Background()
	env := s.open(t, 1)
	var mu sync.Mutex
	runs := map[string]int{}
	p := s.proc(t, env, "ledger", func(m idem.Message) error {
		mu.Lock()
		runs[m.ID]++
		mu.Unlock()
		if strings.HasPrefix(m.ID, "bad") {
			return errors.New("gateway keeps timing out")
		}
		return nil
	}, func(c *idem.Config[TTx]) { c.Retry.MaxAttempts = 3 })
	r := p.Process(ctx, msg("bad-alone"))
	rs := p.ProcessBatch(ctx, []idem.Message{msg("a"), msg("bad-in-batch"), msg("b")})
	want(t, r, idem.DeadLettered)
	want(t, rs[1], idem.DeadLettered)
	want(t, rs[0], idem.Applied)
	want(t, rs[2], idem.Applied)
	mu.Lock()
	defer mu.Unlock()
	if runs["bad-alone"] != 3 || runs["bad-in-batch"] != 3 {
		t.Fatalf("handler runs: alone %d, first in a batch %d; want 3 each (MaxAttempts)", runs["bad-alone"], runs["bad-in-batch"])
	}
	if rs[1].Attempts != 3 {
		t.Fatalf("attempts reported for the batch's failing message: %d, want 3", rs[1].Attempts)
	}
	// With a budget of one, the batch's run is the only one.
	once := s.proc(t, env, "ledger-once", func(m idem.Message) error {
		mu.Lock()
		runs[m.ID]++
		mu.Unlock()
		if strings.HasPrefix(m.ID, "bad") {
			return errors.New("gateway keeps timing out")
		}
		return nil
	}, func(c *idem.Config[TTx]) { c.Retry.MaxAttempts = 1 })
	mu.Unlock()
	rs = once.ProcessBatch(ctx, []idem.Message{msg("c"), msg("bad-once"), msg("d")})
	mu.Lock()
	if rs[1].Outcome != idem.DeadLettered || runs["bad-once"] != 1 || rs[0].Outcome != idem.Applied || rs[2].Outcome != idem.Applied {
		t.Fatalf("budget of one in a batch: %v %v %v, handler ran %d times for the failing message; want applied, dead-lettered after 1 run, applied",
			rs[0].Outcome, rs[1].Outcome, rs[2].Outcome, runs["bad-once"])
	}
}

// slowHandlerIsTheMessagesFault: a handler slower than the transaction's
// deadline (TxTimeout) fails its own tries, whatever that deadline did to
// the connection: the message spends its attempts and is dead-lettered,
// never held forever as if the database were down. On the pool-of-one
// run, three workers on a pool of three time out together: the outage test
// after each failure must not wait for a connection its own failed
// transaction, or another's, still holds.
func (s suite[TTx]) slowHandlerIsTheMessagesFault(t *testing.T) {
	ctx := context.Background()
	n := s.scale(1, 3)
	env := s.open(t, n)
	p := s.proc(t, env, "ledger", nil, func(c *idem.Config[TTx]) {
		c.Retry.MaxAttempts = 2
		c.Retry.WaitUnavailable = 5 * time.Second
		c.TxTimeout = 150 * time.Millisecond
		c.Handler = func(ctx context.Context, tx TTx, m idem.Message) error {
			<-ctx.Done() // slower than the deadline
			return env.Apply(ctx, tx, "ledger", m.ID, m.ID)
		}
	})
	start := time.Now()
	results := make([]idem.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i] = p.Process(ctx, msg(fmt.Sprintf("evt-slow-%d", i))) })
	}
	wg.Wait()
	for _, r := range results {
		if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, idem.ErrRetriesExhausted) || r.Blameless {
			t.Fatalf("handler slower than TxTimeout (%d workers): %s %v (%v, blameless %v) after %v, want a dead letter after 2 attempts",
				n, r.MessageID, r.Outcome, errText(r.Err), r.Blameless, time.Since(start).Round(time.Millisecond))
		}
	}
	if c := count(t, env.Effects, "ledger", ""); c != 0 {
		t.Fatalf("effects = %d, want 0", c)
	}
}

// errText is err for a failure message, which says so when there was none
// rather than ending in "<nil>".
func errText(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
