package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
)

// Setup builds the consumer under test over a fresh, empty database (a new
// schema, a new SQLite file) each time it is called, passing faults on to
// [idem.Config.Faults]. Checks that need a second database, or a processor
// that crashes on cue, call it themselves.
type Setup[TTx any] func(t testing.TB, faults idem.FaultFunc) (*idem.Processor[TTx], Snapshotter)

// Option adjusts a check.
type Option func(*options)

type options struct {
	allowNoEffect bool
}

// AllowNoEffect accepts a first delivery that changes nothing the
// snapshotter sees. By default that fails the check: a consumer test whose
// sample has no visible effect proves nothing, and it usually means the
// sample does not reach the code path that matters or the snapshotter looks
// at the wrong tables.
func AllowNoEffect() Option { return func(o *options) { o.allowNoEffect = true } }

func makeOptions(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return o
}

// DeliverTwice delivers msg, then delivers it again, as a broker does after
// a restart, and fails t unless the first delivery is Applied, the second is
// a Duplicate, and the second changed nothing. The state is compared as a
// whole, so a change nobody thought to assert on still shows; a failure
// names each table, row and column that changed, with its value before →
// after.
//
// A natural consumer ([idem.Config.Natural]) writes no marker, so its second
// delivery is Applied again; it passes when that changed nothing.
func DeliverTwice[TTx any](t testing.TB, proc *idem.Processor[TTx], msg idem.Message, snap Snapshotter, opts ...Option) {
	t.Helper()
	o := makeOptions(opts)
	ctx := t.Context()
	s0 := take(t, snap, "before the first delivery")
	r1 := proc.Process(ctx, msg)
	s1 := take(t, snap, "after the first delivery")
	requireApplied(t, proc, msg, r1)
	requireEffect(t, proc, msg, Compare(s0, s1), o)
	r2 := proc.Process(ctx, msg)
	s2 := take(t, snap, "after the second delivery")
	checkRedelivery(t, proc, msg, r1, r2, Compare(s1, s2), "second delivery")
}

// DeliverConcurrently delivers msg n times at once, as two consumers do
// when a rebalance hands a partition over mid-batch, and fails t unless
// exactly one delivery is Applied, the others are Duplicates, and the
// database ends as one delivery leaves it.
//
// "As one delivery leaves it" is measured, not assumed: setup is called
// three times, for three fresh databases. In the first two, msg is
// delivered once; in the third, n times at once. The race's change must
// have the shape of a single delivery's: the same number of rows added and
// removed per table, the same rows changed, to the same values. Added rows
// are compared by count, since generated keys legitimately differ; a
// changed column whose new value differs between the two single deliveries
// (a clock_timestamp(), a random token) is compared by presence only. This
// catches a natural consumer that checks, then acts (SELECT, then INSERT if
// absent): racing deliveries all see nothing and all insert; and one that
// adds (balance = balance + x): the race adds n times.
func DeliverConcurrently[TTx any](t testing.TB, setup Setup[TTx], msg idem.Message, n int, opts ...Option) {
	t.Helper()
	o := makeOptions(opts)
	if n < 2 {
		t.Fatalf("DeliverConcurrently needs at least 2 deliveries, got %d", n)
	}
	ctx := t.Context()

	var s0 *Snapshot
	var ref idem.Result
	var want [2]Diff
	for i := range want {
		proc, snap := setup(t, nil)
		before := take(t, snap, "before a single delivery")
		if i == 0 {
			s0 = before
		} else if d := Compare(s0, before); !d.Empty() {
			t.Fatalf("setup must return a fresh database on each call; the second one differs from the first:\n%s", d)
		}
		ref = proc.Process(ctx, msg)
		requireApplied(t, proc, msg, ref)
		want[i] = Compare(before, take(t, snap, "after a single delivery"))
	}
	proc, snap := setup(t, nil)
	requireEffect(t, proc, msg, want[0], o)
	b0 := take(t, snap, "before the concurrent deliveries")
	results := make([]idem.Result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			<-start
			results[i] = proc.Process(ctx, msg)
		})
	}
	close(start)
	wg.Wait()
	got := Compare(b0, take(t, snap, "after the concurrent deliveries"))

	var applied, dups int
	var others []string
	for _, r := range results {
		switch r.Outcome {
		case idem.Applied:
			applied++
		case idem.Duplicate:
			dups++
		default:
			others = append(others, fmt.Sprintf("%s (%v)", r.Outcome, r.Err))
		}
	}
	natural := ref.Key == "" // a natural consumer computes no key: every delivery applies
	switch {
	case len(others) > 0:
		t.Errorf("%s: %d concurrent deliveries of message %s: %d applied, %d duplicate, and %s",
			proc.Consumer(), n, msg.ID, applied, dups, strings.Join(others, ", "))
	case !natural && applied != 1:
		t.Errorf("%s: %d concurrent deliveries of message %s: %d applied, want exactly 1 (the inbox claim did not serialize them)",
			proc.Consumer(), n, msg.ID, applied)
	}
	if problems := sameShape(want[0], want[1], got); len(problems) > 0 {
		t.Errorf("%s: %d concurrent deliveries of message %s did not leave the database as one delivery does:\n  %s\none delivery:\n%s\n%d concurrent deliveries:\n%s",
			proc.Consumer(), n, msg.ID, strings.Join(problems, "\n  "), want[0], n, got)
	}
}

// errCrash is the failure CrashAfterCommit injects between commit and ack.
var errCrash = errors.New("idemtest: simulated crash after commit, before ack")

// CrashAfterCommit delivers msg to a processor that crashes right after
// its transaction commits, before the broker is acked, so the broker
// delivers msg again; it fails t unless the effect committed once, the
// first delivery was left for redelivery (Retry), and the redelivery is a
// Duplicate that changes nothing. setup is called once; it must pass faults
// to [idem.Config.Faults].
func CrashAfterCommit[TTx any](t testing.TB, setup Setup[TTx], msg idem.Message, opts ...Option) {
	t.Helper()
	o := makeOptions(opts)
	ctx := t.Context()
	var crashed atomic.Bool
	faults := func(_ context.Context, point idem.FaultPoint, _ []idem.Message) error {
		if point == idem.AfterCommit && crashed.CompareAndSwap(false, true) {
			return errCrash
		}
		return nil
	}
	proc, snap := setup(t, faults)
	s0 := take(t, snap, "before the first delivery")
	r1 := proc.Process(ctx, msg)
	s1 := take(t, snap, "after the crash")
	if !crashed.Load() {
		t.Fatalf("%s: the processor never reached idem.AfterCommit (outcome %s, %v); setup must pass its faults argument to idem.Config.Faults",
			proc.Consumer(), r1.Outcome, r1.Err)
	}
	if r1.Outcome != idem.Retry || !errors.Is(r1.Err, errCrash) {
		t.Fatalf("%s: a crash after commit must leave message %s for redelivery: outcome %s (%v), want retry",
			proc.Consumer(), msg.ID, r1.Outcome, r1.Err)
	}
	requireEffect(t, proc, msg, Compare(s0, s1), o)
	r2 := proc.Process(ctx, msg)
	s2 := take(t, snap, "after the redelivery")
	checkRedelivery(t, proc, msg, r1, r2, Compare(s1, s2), "redelivery after the crash")
}

// take reads a snapshot or stops the test.
func take(t testing.TB, snap Snapshotter, when string) *Snapshot {
	t.Helper()
	s, err := snap.Snapshot(t.Context())
	if err != nil {
		t.Fatalf("snapshot %s: %v", when, err)
	}
	return s
}

func requireApplied[TTx any](t testing.TB, proc *idem.Processor[TTx], msg idem.Message, r idem.Result) {
	t.Helper()
	if r.Outcome != idem.Applied {
		t.Fatalf("%s: first delivery of message %s: outcome %s, want applied (error: %v)", proc.Consumer(), msg.ID, r.Outcome, r.Err)
	}
}

func requireEffect[TTx any](t testing.TB, proc *idem.Processor[TTx], msg idem.Message, d Diff, o options) {
	t.Helper()
	if d.Empty() && !o.allowNoEffect {
		t.Errorf("%s: the first delivery of message %s changed nothing the snapshotter sees, so this test proves nothing; "+
			"check that the sample reaches the effect and the snapshotter reads its tables, or pass idemtest.AllowNoEffect()",
			proc.Consumer(), msg.ID)
	}
}

// checkRedelivery fails t unless r2, a repeat of msg, was recognised and
// changed nothing (d is the change it caused).
func checkRedelivery[TTx any](t testing.TB, proc *idem.Processor[TTx], msg idem.Message, r1, r2 idem.Result, d Diff, what string) {
	t.Helper()
	natural := r2.Key == "" // a natural consumer computes no key
	switch {
	case r2.Outcome == idem.Duplicate:
	case r2.Outcome == idem.Applied && natural:
	case r2.Outcome == idem.Applied:
		t.Errorf("%s: the inbox did not recognise the %s of message %s: applied again (key %q, first key %q); is the key func stable across deliveries?",
			proc.Consumer(), what, msg.ID, r2.Key, r1.Key)
	default:
		t.Errorf("%s: %s of message %s: outcome %s, want duplicate (error: %v)", proc.Consumer(), what, msg.ID, r2.Outcome, r2.Err)
	}
	if !d.Empty() {
		t.Errorf("%s is not idempotent: the %s of message %s (outcome %s) changed the database:\n%s",
			proc.Consumer(), what, msg.ID, r2.Outcome, d)
	}
}

// sameShape lists how got differs from want in shape: rows added and
// removed per table by count, rows changed by key and new values. Columns
// whose new values differ between want and want2, two single deliveries on
// fresh databases, are volatile: only that they changed is compared.
func sameShape(want, want2, got Diff) []string {
	var problems []string
	tables := want.TableNames()
	for _, n := range got.TableNames() {
		if !slices.Contains(tables, n) {
			tables = append(tables, n)
		}
	}
	for _, name := range tables {
		w, w2, g := tableDiff(want, name), tableDiff(want2, name), tableDiff(got, name)
		if len(w.Added) != len(g.Added) {
			problems = append(problems, fmt.Sprintf("%s: one delivery adds %s, these added %s", name, rows(len(w.Added)), rows(len(g.Added))))
		}
		if len(w.Removed) != len(g.Removed) {
			problems = append(problems, fmt.Sprintf("%s: one delivery removes %s, these removed %s", name, rows(len(w.Removed)), rows(len(g.Removed))))
		}
		volatile := map[string]bool{}
		w2c := changedValues(w2)
		for k, cols := range changedValues(w) {
			for c, v := range cols {
				if v2, ok := w2c[k][c]; !ok || v2 != v {
					volatile[k+"\x00"+c] = true
				}
			}
		}
		render := func(key string, cols map[string]string) string {
			var parts []string
			for c, v := range cols {
				if volatile[key+"\x00"+c] {
					v = "(any)"
				}
				parts = append(parts, c+"="+v)
			}
			slices.Sort(parts)
			return strings.Join(parts, ", ")
		}
		wc, gc := changedValues(w), changedValues(g)
		var changes []string
		for k, cols := range wc {
			v := render(k, cols)
			if gcols, ok := gc[k]; !ok {
				changes = append(changes, fmt.Sprintf("%s row %s: one delivery changes it (%s), these did not", name, k, v))
			} else if gv := render(k, gcols); gv != v {
				changes = append(changes, fmt.Sprintf("%s row %s: one delivery leaves %s, these left %s", name, k, v, gv))
			}
		}
		for k, cols := range gc {
			if _, ok := wc[k]; !ok {
				changes = append(changes, fmt.Sprintf("%s row %s: changed (%s), one delivery leaves it alone", name, k, render(k, cols)))
			}
		}
		slices.Sort(changes) // map order is random; failures should read the same each run
		problems = append(problems, changes...)
	}
	return problems
}

func tableDiff(d Diff, name string) TableDiff {
	for _, t := range d.Tables {
		if t.Table == name {
			return t
		}
	}
	return TableDiff{Table: name}
}

// changedValues maps each changed row's key to its changed columns' new
// values.
func changedValues(t TableDiff) map[string]map[string]string {
	m := map[string]map[string]string{}
	for _, r := range t.Changed {
		cols := map[string]string{}
		for _, c := range r.Columns {
			cols[c.Column] = c.After
		}
		m[r.Key] = cols
	}
	return m
}
