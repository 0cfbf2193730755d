package adaptertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/pooltest"
	"github.com/idemkit/idem/pgxinbox"
)

// poolOfOne is a harness whose checks run their processor on a pool of
// one connection (see Run).
type poolOfOne struct{ Harness }

// consumerName is the processor's name in every check.
const consumerName = "conformance"

// maxAttempts is the retry budget of every check's processor.
const maxAttempts = 3

// env is one check's world: a topic of the harness, a PostgreSQL schema
// with an inbox and an effects table that has no unique constraint (an
// effect applied twice shows as two rows), and a recorder of everything
// the processor and the adapter report.
type env struct {
	t     *testing.T
	h     Harness
	topic string
	url   string // the schema's URL
	pool  *pgxpool.Pool
	// procPool is the processor's pool: pool, or on the pool-of-one run
	// a pool of its own with one connection (the checks' own reads of the
	// effects stay on pool, outside the processor's).
	procPool *pgxpool.Pool
	layout   pgxinbox.Layout
	rec      *recorder
	log      *slog.Logger
}

func newEnv(t *testing.T, h Harness, layout pgxinbox.Layout) *env {
	t.Helper()
	conns := 0
	if p, ok := h.(poolOfOne); ok {
		h, conns = p.Harness, 1
	}
	e := &env{t: t, h: h, layout: layout, rec: newRecorder(), log: testLogger(t)}
	e.url = pgtest.Schema(t)
	e.pool = e.openPool(e.url)
	e.procPool = e.pool
	if conns > 0 {
		e.procPool = pooltest.OpenPgx(t, e.url, conns)
	}
	if _, err := e.pool.Exec(context.Background(),
		`CREATE TABLE effects (seq bigserial PRIMARY KEY, message_id text NOT NULL, body text NOT NULL)`); err != nil {
		t.Fatalf("creating the effects table: %v (%s)", err, pgtest.FixHint)
	}
	e.topic = h.Topic(t)
	return e
}

func (e *env) openPool(u string) *pgxpool.Pool {
	e.t.Helper()
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		e.t.Fatalf("opening pool: %v", err)
	}
	e.t.Cleanup(pool.Close)
	return pool
}

// proxiedPool is a pool on the check's schema whose connections go
// through a netfault proxy, with connect_timeout=1: an outage made there
// is the one production has (a connect that times out, a read that never
// returns, a reset).
func (e *env) proxiedPool() (*pgxpool.Pool, *netfault.Proxy) {
	e.t.Helper()
	u, err := url.Parse(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	p := netfault.New(e.t, u.Host)
	pu, err := url.Parse(p.URL(e.t, e.url))
	if err != nil {
		e.t.Fatal(err)
	}
	q := pu.Query()
	q.Set("connect_timeout", "1")
	pu.RawQuery = q.Encode()
	return e.openPool(pu.String()), p
}

// store is an inbox on pool, migrated unless bare.
func (e *env) store(pool *pgxpool.Pool, bare bool) *pgxinbox.Store {
	e.t.Helper()
	cfg := &pgxinbox.Config{Layout: e.layout}
	if e.layout == pgxinbox.Partitioned {
		// Two days: few partitions to create, and still far longer than
		// any check.
		cfg.Window = 48 * time.Hour
	}
	s, err := pgxinbox.New(pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if !bare {
		if err := s.Migrate(context.Background()); err != nil {
			e.t.Fatalf("migrating the inbox: %v", err)
		}
	}
	return s
}

// procOptions shape a check's processor.
type procOptions struct {
	// store defaults to a migrated inbox on the env's pool.
	store *pgxinbox.Store
	// fail, when set, is asked before each handler run (run counts the
	// message's runs from 1); an error it returns is the handler's.
	fail   func(ctx context.Context, m idem.Message, run int) error
	faults idem.FaultFunc
}

// processor is the check's processor: keyed by message ID, writing one
// effects row per run that commits, with a small retry budget and short
// waits so that the checks stay fast.
func (e *env) processor(o procOptions) *idem.Processor[pgx.Tx] {
	e.t.Helper()
	if o.store == nil {
		o.store = e.store(e.procPool, false)
	}
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		run := e.rec.ran(m.ID)
		if o.fail != nil {
			if err := o.fail(ctx, m, run); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
		return err
	}
	p, err := idem.NewProcessor(o.store, &idem.Config[pgx.Tx]{
		Consumer: consumerName,
		Key:      idem.ByMessageID,
		Handler:  h,
		Retry: idem.RetryPolicy{
			MaxAttempts:     maxAttempts,
			Backoff:         idem.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
			WaitUnavailable: 500 * time.Millisecond,
		},
		TxTimeout:     2 * time.Second,
		CommitTimeout: 2 * time.Second,
		Logger:        e.log,
		Hooks:         []idem.Hook{e.rec},
		Faults:        o.faults,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) consumer(p *idem.Processor[pgx.Tx], opts ConsumerOptions) Consumer {
	e.t.Helper()
	opts.Logger = e.log
	return e.h.Consumer(e.t, e.topic, p, opts)
}

// running is a consumer the suite started.
type running struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	within time.Duration
	once   sync.Once
}

// start runs c until stop or the end of the check.
func (e *env) start(c Consumer) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: e.t, cancel: cancel, done: make(chan struct{}), within: e.h.Features().stopWithin()}
	go func() {
		defer close(r.done)
		r.err = c.Run(ctx)
	}()
	e.t.Cleanup(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			e.t.Errorf("Run did not return within 30s of the end of the check")
		}
	})
	return r
}

// stop cancels Run and returns its error; it fails the check when Run
// takes longer than the harness's StopWithin to return.
func (r *running) stop() error {
	r.t.Helper()
	r.cancel()
	start := time.Now()
	select {
	case <-r.done:
	case <-time.After(r.within):
		r.t.Fatalf("Run did not return within %v of its context's cancel", r.within)
	}
	r.once.Do(func() { r.t.Logf("Run returned %v after cancel", time.Since(start).Round(time.Millisecond)) })
	return r.err
}

// exited reports whether Run returned on its own, and its error.
func (r *running) exited() (bool, error) {
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}

// refused runs c and returns the error it refused to start with; it fails
// the check when Run takes messages instead (it is still running after
// within) or returns nil.
func (e *env) refused(c Consumer, within time.Duration) error {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	select {
	case err := <-errc:
		if err == nil {
			e.t.Fatalf("Run returned nil; want it to refuse to start")
		}
		return err
	case <-time.After(within):
		cancel()
		<-errc
		e.t.Fatalf("Run still ran %v after it started; want it to refuse to start", within)
		return nil
	}
}

// publish publishes msgs to the check's topic.
func (e *env) publish(msgs ...Message) {
	e.t.Helper()
	e.h.Publish(e.t, e.topic, msgs...)
}

// deadLetters reads the topic's dead-letter destination.
func (e *env) deadLetters() []DeadLetter {
	e.t.Helper()
	return e.h.DeadLetters(e.t, e.topic)
}

// waitFor waits up to d for cond, checking it at every event the
// recorder sees and every 50ms (for state nothing signals: the effects
// table, a dead-letter destination).
func (e *env) waitFor(d time.Duration, what string, cond func() bool) {
	e.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-e.rec.changed:
		case <-tick.C:
		case <-deadline.C:
			e.t.Fatalf("timed out after %v waiting for %s\n%s", d, what, e.rec.summary())
		}
	}
}

// acked waits until each of ids was acked after its latest outcome.
func (e *env) acked(d time.Duration, ids ...string) {
	e.t.Helper()
	e.waitFor(d, fmt.Sprintf("%d messages acked (%s)", len(ids), strings.Join(ids, ", ")), func() bool {
		for _, id := range ids {
			if !e.rec.settled(id) {
				return false
			}
		}
		return true
	})
}

// effects counts the effects rows by message ID, and by body.
func (e *env) effects() (byID, byBody map[string]int) {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT message_id, body FROM effects ORDER BY seq`)
	if err != nil {
		e.t.Fatal(err)
	}
	byID, byBody = map[string]int{}, map[string]int{}
	for rows.Next() {
		var id, body string
		if err := rows.Scan(&id, &body); err != nil {
			e.t.Fatal(err)
		}
		byID[id]++
		byBody[body]++
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return byID, byBody
}

// order is the message IDs of the effects rows in the order they were
// written.
func (e *env) order() []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT message_id FROM effects ORDER BY seq`)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// wantEffects fails the check unless exactly ids were applied, each once.
func (e *env) wantEffects(ids ...string) {
	e.t.Helper()
	byID, _ := e.effects()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
		if n := byID[id]; n != 1 {
			e.t.Errorf("message %s applied %d times; want once", id, n)
		}
	}
	for id, n := range byID {
		if !want[id] {
			e.t.Errorf("message %q applied %d times; want never", id, n)
		}
	}
}

// wantNoDeadLetters fails the check when anything was dead-lettered.
func (e *env) wantNoDeadLetters() {
	e.t.Helper()
	if dl := e.deadLetters(); len(dl) > 0 {
		e.t.Errorf("%d dead letters; want none: %s", len(dl), describe(dl))
	}
	if n := e.rec.deadLettered(); n > 0 {
		e.t.Errorf("%d results dead-lettered or expired; want none\n%s", n, e.rec.summary())
	}
}

// deadLetterOf waits for the dead letter whose body is body and returns
// it, failing the check when more than one copy arrived.
func (e *env) deadLetterOf(d time.Duration, body string) DeadLetter {
	e.t.Helper()
	var found []DeadLetter
	e.waitFor(d, "the dead letter of "+body, func() bool {
		found = found[:0]
		for _, dl := range e.deadLetters() {
			if string(dl.Body) == body {
				found = append(found, dl)
			}
		}
		return len(found) > 0
	})
	return found[0]
}

// copiesOf counts the dead letters whose body is body.
func copiesOf(dls []DeadLetter, body string) int {
	n := 0
	for _, dl := range dls {
		if string(dl.Body) == body {
			n++
		}
	}
	return n
}

func describe(dls []DeadLetter) string {
	var b strings.Builder
	for _, dl := range dls {
		fmt.Fprintf(&b, "\n  id=%q body=%q reason=%q attempts=%q", dl.ID, dl.Body, dl.Headers[idembroker.HeaderReason], dl.Headers[idembroker.HeaderAttempts])
	}
	return b.String()
}

// wantHeaders checks the x-idem-* headers of a dead letter of the check's
// topic: attempts is the number of transactions the message was in.
func (e *env) wantHeaders(dl DeadLetter, outcome string, reasonHas string, attempts int) {
	e.t.Helper()
	h := dl.Headers
	if r := h[idembroker.HeaderReason]; r == "" || !strings.Contains(r, reasonHas) {
		e.t.Errorf("dead letter %q: %s = %q; want it to say %q", dl.Body, idembroker.HeaderReason, r, reasonHas)
	}
	if got := h[idembroker.HeaderOutcome]; got != outcome {
		e.t.Errorf("dead letter %q: %s = %q; want %q", dl.Body, idembroker.HeaderOutcome, got, outcome)
	}
	if got := h[idembroker.HeaderConsumer]; got != consumerName {
		e.t.Errorf("dead letter %q: %s = %q; want %q", dl.Body, idembroker.HeaderConsumer, got, consumerName)
	}
	if got := h[idembroker.HeaderOrigin]; !strings.Contains(got, e.topic) {
		e.t.Errorf("dead letter %q: %s = %q; want it to name %s", dl.Body, idembroker.HeaderOrigin, got, e.topic)
	}
	if dl.attempts() != attempts {
		e.t.Errorf("dead letter %q: %s = %q; want %d", dl.Body, idembroker.HeaderAttempts, h[idembroker.HeaderAttempts], attempts)
	}
}

// recorder is every hook the processor and the adapter call, kept by
// message ID, and the handler's runs; it signals each change.
type recorder struct {
	mu       sync.Mutex
	runs     map[string]int
	outcomes map[string][]idem.Outcome
	results  []idem.Result
	settles  map[string][]idem.Action
	// seq numbers the events; lastOutcome and lastAck are the numbers of
	// each message's latest outcome and latest ack.
	seq         int
	lastOutcome map[string]int
	lastAck     map[string]int
	failed      []idem.Attempt
	dead        []idem.Result
	deadFailed  int // dead letters that failed to be written
	changed     chan struct{}
}

func newRecorder() *recorder {
	return &recorder{
		runs: map[string]int{}, outcomes: map[string][]idem.Outcome{}, settles: map[string][]idem.Action{},
		lastOutcome: map[string]int{}, lastAck: map[string]int{},
		changed: make(chan struct{}, 1),
	}
}

func (r *recorder) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// ran counts a handler run of id and returns its number.
func (r *recorder) ran(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[id]++
	return r.runs[id]
}

func (r *recorder) OnOutcome(_ string, res idem.Result, _ time.Duration) {
	r.mu.Lock()
	r.outcomes[res.MessageID] = append(r.outcomes[res.MessageID], res.Outcome)
	r.seq++
	r.lastOutcome[res.MessageID] = r.seq
	r.results = append(r.results, res)
	r.mu.Unlock()
	r.signal()
}

func (r *recorder) OnAttempt(_ string, a idem.Attempt) {
	r.mu.Lock()
	r.failed = append(r.failed, a)
	r.mu.Unlock()
	r.signal()
}

func (r *recorder) OnSettle(_, _ string, d idem.Disposition, res idem.Result) {
	r.mu.Lock()
	r.settles[res.MessageID] = append(r.settles[res.MessageID], d.Action)
	r.seq++
	if d.Action == idem.ActionAck {
		r.lastAck[res.MessageID] = r.seq
	}
	r.mu.Unlock()
	r.signal()
}

func (r *recorder) OnDeadLetter(_, _ string, res idem.Result, err error) {
	r.mu.Lock()
	if err != nil {
		r.deadFailed++
	} else {
		r.dead = append(r.dead, res)
	}
	r.mu.Unlock()
	r.signal()
}

// deadLetterFailures counts dead letters the adapter failed to write.
func (r *recorder) deadLetterFailures() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deadFailed
}

// handlerRuns is how many times the handler ran for id.
func (r *recorder) handlerRuns(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

// acks is how many times id was acked (Applied or Duplicate settled).
func (r *recorder) acks(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.settles[id] {
		if a == idem.ActionAck {
			n++
		}
	}
	return n
}

// settled reports whether id was acked after its latest outcome: no
// copy of it is still between the processor and the broker.
func (r *recorder) settled(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastAck[id] > r.lastOutcome[id]
}

// outcomesOf returns the outcomes the processor reported for id.
func (r *recorder) outcomesOf(id string) []idem.Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.outcomes[id])
}

// failures returns the failed tries so far.
func (r *recorder) failures() []idem.Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.failed)
}

// blamelessRetries counts Retry results marked Blameless: messages held
// for an outage past RetryPolicy.WaitUnavailable.
func (r *recorder) blamelessRetries() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, res := range r.results {
		if res.Outcome == idem.Retry && res.Blameless && !errors.Is(res.Err, idem.ErrNotAttempted) {
			n++
		}
	}
	return n
}

// deadLettered counts dead-lettered and expired results, and dead letters
// the adapter reported written.
func (r *recorder) deadLettered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.dead)
	for _, res := range r.results {
		if res.Outcome == idem.DeadLettered || res.Outcome == idem.Expired {
			n++
		}
	}
	return n
}

// summary describes what was recorded, for a failing check.
func (r *recorder) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	ids := make([]string, 0, len(r.outcomes))
	for id := range r.outcomes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b.WriteString("recorded:")
	for _, id := range ids {
		fmt.Fprintf(&b, "\n  %q: outcomes %v, settled %v, handler runs %d", id, r.outcomes[id], r.settles[id], r.runs[id])
	}
	fmt.Fprintf(&b, "\n  %d failed tries, %d dead letters written", len(r.failed), len(r.dead))
	if n := len(r.failed); n > 0 {
		a := r.failed[n-1]
		fmt.Fprintf(&b, "; last failed try: %v (class %v)", a.Err, a.Class)
	}
	return b.String()
}

// testLogger logs warnings and worse to t while the check runs, and
// drops what comes after it ended (a consumer still shutting down).
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close) // registered first: runs last
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// UUIDv7 returns a version 7 UUID whose time is at: the partition time a
// partitioned inbox derives from a message keyed by its ID.
func UUIDv7(at time.Time) string { return idem.NewUUIDv7(at) }

// uniqueBody is a body no other message of any check carries.
func uniqueBody(what string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return what + "-" + hex.EncodeToString(b[:])
}

// failedTries counts the failed transactions id was in: all of them, or
// (own) only those it was alone in.
func (r *recorder) failedTries(id string, own bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.failed {
		if !slices.Contains(a.MessageIDs, id) || own && (a.Batch || len(a.MessageIDs) != 1) {
			continue
		}
		n++
	}
	return n
}

// failedOfClass counts failed tries whose error had class c.
func (r *recorder) failedOfClass(c idemstore.ErrorClass) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.failed {
		if a.Class == c {
			n++
		}
	}
	return n
}

// deadLetterSettles counts messages settled as dead letters.
func (r *recorder) deadLetterSettles() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, as := range r.settles {
		n += countOf(as, idem.ActionDeadLetter)
	}
	return n
}

// triesSince describes the failed tries after the first n: how many of
// each class, and the first error of each.
func (r *recorder) triesSince(n int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	count := map[idemstore.ErrorClass]int{}
	first := map[idemstore.ErrorClass]error{}
	var classes []idemstore.ErrorClass
	for _, a := range r.failed[min(n, len(r.failed)):] {
		if count[a.Class] == 0 {
			classes = append(classes, a.Class)
			first[a.Class] = a.Err
		}
		count[a.Class]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d failed tries", len(r.failed)-min(n, len(r.failed)))
	for _, c := range classes {
		fmt.Fprintf(&b, "; %d of class %s, first: %v", count[c], className(c), first[c])
	}
	return b.String()
}

func className(c idemstore.ErrorClass) string {
	switch c {
	case idemstore.ClassTransient:
		return "transient"
	case idemstore.ClassPermanent:
		return "permanent"
	case idemstore.ClassUnavailable:
		return "unavailable"
	case idemstore.ClassConfig:
		return "config"
	}
	return fmt.Sprint(int(c))
}
