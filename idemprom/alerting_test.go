package idemprom_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// family gathers reg and returns the family called name, or nil.
func family(t *testing.T, reg prometheus.Gatherer, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

// value is the value of the series of family name whose labels include
// want; ok is false when there is none.
func value(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) (v float64, ok bool) {
	t.Helper()
	mf := family(t, reg, name)
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

func migrated(t *testing.T, pool *pgxpool.Pool) *pgxinbox.Store {
	t.Helper()
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return store
}

// TestDuplicateAgeBuckets processes messages, moves the write time of
// their markers into the past the way long-ago messages would have left
// them, and sends each again: every duplicate lands in the bucket of its
// marker's age, a key repeated inside one batch in the first.
func TestDuplicateAgeBuckets(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store := migrated(t, pool)
	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, Hooks: []idem.Hook{m},
		Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ages := map[string]string{ // message ID → how long ago its marker was written
		"evt-replayed":    "2 days",     // (1d, 3d]
		"evt-republished": "10 days",    // (7d, 14d]
		"evt-restart":     "5 minutes",  // (1m, 10m]
		"evt-rebalance":   "30 minutes", // (10m, 1h]
		"evt-redelivered": "30 seconds", // (10s, 1m]
		"evt-dlq-redrive": "3 hours",    // (1h, 6h]
	}
	for id := range ages {
		if r := p.Process(ctx, idem.Message{ID: id, Body: []byte(id)}); r.Outcome != idem.Applied {
			t.Fatalf("%s: %v (%v)", id, r.Outcome, r.Err)
		}
	}
	for id, ago := range ages {
		if _, err := pool.Exec(ctx, `UPDATE idem_inbox SET processed_at = now() - $2::interval WHERE consumer = 'ledger' AND key = $1`, id, ago); err != nil {
			t.Fatal(err)
		}
	}
	for id := range ages {
		if r := p.Process(ctx, idem.Message{ID: id, Body: []byte(id)}); r.Outcome != idem.Duplicate {
			t.Fatalf("%s again: %v (%v)", id, r.Outcome, r.Err)
		}
	}
	for _, r := range p.ProcessBatch(ctx, []idem.Message{{ID: "evt-twice"}, {ID: "evt-twice"}}) {
		if !r.Outcome.Acked() {
			t.Fatalf("batch: %v (%v)", r.Outcome, r.Err)
		}
	}

	mf := family(t, reg, "idem_duplicate_age_seconds")
	if mf == nil || len(mf.GetMetric()) != 1 {
		t.Fatalf("idem_duplicate_age_seconds: %v, want one series", mf)
	}
	h := mf.GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 7 {
		t.Fatalf("%d duplicates observed, want 7", h.GetSampleCount())
	}
	// Cumulative counts at each upper bound.
	want := map[float64]uint64{
		1:          1, // the in-batch repeat
		10:         1,
		60:         2,
		600:        3,
		3600:       4,
		6 * 3600:   5,
		86400:      5,
		3 * 86400:  6,
		7 * 86400:  6,
		14 * 86400: 7,
		30 * 86400: 7,
	}
	if len(h.GetBucket()) != len(want) {
		t.Fatalf("%d buckets, want %d", len(h.GetBucket()), len(want))
	}
	for _, b := range h.GetBucket() {
		if w, ok := want[b.GetUpperBound()]; !ok || b.GetCumulativeCount() != w {
			t.Errorf("bucket le=%v: %d duplicates, want %d", b.GetUpperBound(), b.GetCumulativeCount(), w)
		}
	}
}

// deadLetterSignal counts the dead letters the consumer wrote.
type deadLetterSignal struct {
	mu   sync.Mutex
	n    int
	want int
	done chan struct{}
}

func (s *deadLetterSignal) OnDeadLetter(_, _ string, _ idem.Result, err error) {
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	if s.n == s.want {
		close(s.done)
	}
}

// TestDeadLettersByReason runs the Kafka adapter against an in-process
// Kafka (kfake) and PostgreSQL: a record without an ID, one whose handler
// fails permanently, one whose handler keeps failing until its budget is
// spent, and a good one. Each dead letter is counted under its reason.
func TestDeadLettersByReason(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster := kafkatest.NewCluster(t)
	seeds := kgo.SeedBrokers(cluster.ListenAddrs()...)
	admin, err := kgo.NewClient(seeds, kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const topic = "invoices"
	if _, err := kadm.NewClient(admin).CreateTopics(ctx, 1, 1, nil, topic, topic+".dlq"); err != nil {
		t.Fatal(err)
	}
	id := func(s string) []kgo.RecordHeader {
		return []kgo.RecordHeader{{Key: idemkafka.DefaultIDHeader, Value: []byte(s)}}
	}
	recs := []*kgo.Record{
		{Topic: topic, Value: []byte("anonymous")},
		{Topic: topic, Value: []byte("unknown customer"), Headers: id("evt-permanent")},
		{Topic: topic, Value: []byte("flaky"), Headers: id("evt-flaky")},
		{Topic: topic, Value: []byte("fine"), Headers: id("evt-fine")},
	}
	if err := admin.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	pool := pgtest.Pool(t)
	store := migrated(t, pool)
	reg := prometheus.NewRegistry()
	m := idemprom.New(reg)
	signal := &deadLetterSignal{want: 3, done: make(chan struct{})}
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "billing", Key: idem.ByMessageID,
		Retry: idem.RetryPolicy{MaxAttempts: 2, Backoff: idem.Backoff{Initial: time.Millisecond, Max: time.Millisecond}},
		Handler: func(_ context.Context, _ pgx.Tx, msg idem.Message) error {
			switch string(msg.Body) {
			case "unknown customer":
				return idem.Permanent(errors.New("customer 42 does not exist"))
			case "flaky":
				return errors.New("gateway timed out")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(append(idemkafka.GroupOptions("billing", topic), seeds), kafkatest.GroupOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, err := idemkafka.NewConsumer(cl, p, &idemkafka.Config{Hooks: []idem.Hook{m, signal}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx) }()
	select {
	case <-signal.done:
	case err := <-ran:
		t.Fatalf("consumer stopped before its dead letters: %v", err)
	case <-ctx.Done():
		t.Fatal("the three dead letters were not written")
	}
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	for reason, want := range map[string]float64{
		idemprom.ReasonNoMessageID: 1, idemprom.ReasonPermanent: 1, idemprom.ReasonRetriesExhausted: 1,
	} {
		got, _ := value(t, reg, "idem_dead_letters_total", map[string]string{"consumer": "billing", "result": "ok", "reason": reason})
		if got != want {
			t.Errorf("idem_dead_letters_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	if mf := family(t, reg, "idem_dead_letters_total"); mf == nil || len(mf.GetMetric()) != 3 {
		t.Errorf("idem_dead_letters_total: %v, want three series, one per reason", mf)
	}
}

// TestReasonCodes checks the label of the results the processor produces
// without a broker: bad input of each kind, an expired message, a refused
// untimed one.
func TestReasonCodes(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store := migrated(t, pool)
	proc := func(refuseUntimed bool) *idem.Processor[pgx.Tx] {
		p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
			Consumer: "ledger", RefuseUntimed: refuseUntimed,
			Key: func(m idem.Message) (string, error) {
				if string(m.Body) == "no key" {
					return "", errors.New("no customer in the body")
				}
				return m.ID, nil
			},
			Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	now := time.Now()
	for _, c := range []struct {
		refuse bool
		msg    idem.Message
		want   string
	}{
		{false, idem.Message{}, idemprom.ReasonNoMessageID},
		{false, idem.Message{ID: "evt-1", Body: []byte("no key"), Time: now, TimeSource: idem.TimeFromHeader}, idemprom.ReasonBadKey},
		{true, idem.Message{ID: "evt-2"}, idemprom.ReasonUntimed},
		{false, idem.Message{ID: "evt-3", Time: now.Add(-90 * 24 * time.Hour), TimeSource: idem.TimeFromHeader}, idemprom.ReasonExpired},
		{false, idem.Message{ID: "evt-4", Time: now, TimeSource: idem.TimeFromHeader}, idemprom.ReasonOther},
	} {
		r := proc(c.refuse).Process(ctx, c.msg)
		if got := idemprom.Reason(r); got != c.want {
			t.Errorf("message %q (%v, %v): reason %q, want %q", c.msg.ID, r.Outcome, r.Err, got, c.want)
		}
	}
}

// TestInboxCollector reads the per-consumer gauges of a table whose
// markers were written at known times.
func TestInboxCollector(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store := migrated(t, pool)
	for _, q := range []string{
		`INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until)
SELECT 'ledger', 'l-' || g, 'l-' || g, '\x00', now() - g * interval '1 day', now() - g * interval '1 day' FROM generate_series(1, 3) g`,
		`INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until)
SELECT 'invoices', 'i-' || g, 'i-' || g, '\x00', now() - g * interval '1 hour', now() - g * interval '1 hour' FROM generate_series(1, 5) g`,
		// A marker extended by a later duplicate: its keep_until counts.
		`INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until)
VALUES ('stats', 's-1', 's-1', '\x00', now() - interval '20 days', now() - interval '1 minute')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	coll := idemprom.NewInboxCollector(store, "idem_inbox", nil)
	reg.MustRegister(coll)
	if err := coll.Count(ctx); err != nil {
		t.Fatal(err)
	}

	window, ok := value(t, reg, "idem_inbox_window_seconds", nil)
	if !ok || window != store.Window().Seconds() {
		t.Fatalf("idem_inbox_window_seconds = %v (%v), want the stored %v", window, ok, store.Window())
	}
	if up, _ := value(t, reg, "idem_inbox_stats_up", nil); up != 1 {
		t.Fatalf("idem_inbox_stats_up = %v (last error %v)", up, coll.Err())
	}
	for consumer, c := range map[string]struct {
		markers  float64
		min, max time.Duration // the oldest marker's age is at least min and under max
	}{
		"ledger":   {3, 3 * 24 * time.Hour, 4 * 24 * time.Hour},
		"invoices": {5, 5 * time.Hour, 6 * time.Hour},
		"stats":    {1, time.Minute, time.Hour},
	} {
		l := map[string]string{"table": "idem_inbox", "consumer": consumer}
		markers, _ := value(t, reg, "idem_inbox_consumer_markers", l)
		age, _ := value(t, reg, "idem_inbox_consumer_oldest_marker_age_seconds", l)
		headroom, _ := value(t, reg, "idem_inbox_consumer_headroom_seconds", l)
		if markers != c.markers {
			t.Errorf("%s: %v markers, want %v", consumer, markers, c.markers)
		}
		if age < c.min.Seconds() || age >= c.max.Seconds() {
			t.Errorf("%s: oldest marker %v s old, want at least %v (and under %v)", consumer, age, c.min, c.max)
		}
		if math.Abs(headroom-(window-age)) > 1e-6 {
			t.Errorf("%s: headroom %v, want window %v minus age %v", consumer, headroom, window, age)
		}
	}
	// One read serves the scrapes of an interval: a consumer that wrote
	// its first marker since shows at the next read, not before; markers
	// show when next counted.
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('ledger', 'l-new', 'l-new', '\x00'), ('audit', 'a-1', 'a-1', '\x00')`); err != nil {
		t.Fatal(err)
	}
	if _, ok := value(t, reg, "idem_inbox_consumer_headroom_seconds", map[string]string{"consumer": "audit"}); ok {
		t.Error("within the interval: a consumer that was not there at the last read is exported")
	}
	if markers, _ := value(t, reg, "idem_inbox_consumer_markers", map[string]string{"consumer": "ledger"}); markers != 3 {
		t.Errorf("before the next count: %v ledger markers, want the counted 3", markers)
	}
	if err := coll.Count(ctx); err != nil {
		t.Fatal(err)
	}
	if markers, _ := value(t, reg, "idem_inbox_consumer_markers", map[string]string{"consumer": "ledger"}); markers != 4 {
		t.Errorf("after a count: %v ledger markers, want 4", markers)
	}
	fresh := prometheus.NewRegistry()
	fresh.MustRegister(idemprom.NewInboxCollector(store, "idem_inbox", &idemprom.InboxOptions{Interval: -1, CountInterval: -1}))
	if age, ok := value(t, fresh, "idem_inbox_consumer_oldest_marker_age_seconds", map[string]string{"consumer": "audit"}); !ok || age > time.Hour.Seconds() {
		t.Errorf("reading on every scrape: audit's oldest marker %v s old (%v), want it, just written", age, ok)
	}
	if _, ok := value(t, fresh, "idem_inbox_consumer_markers", nil); ok {
		t.Error("a collector that never counts exports markers")
	}
	for _, read := range []string{"oldest", "markers"} {
		if errs, ok := value(t, reg, "idem_inbox_scrape_errors_total", map[string]string{"read": read}); !ok || errs != 0 {
			t.Errorf("idem_inbox_scrape_errors_total{read=%q} = %v (%v), want 0", read, errs, ok)
		}
	}
}

// gatherWithin gathers reg in a goroutine and fails the test if ctx ends
// first: a scrape that hangs on a dead database.
func gatherWithin(ctx context.Context, t *testing.T, reg prometheus.Gatherer) {
	t.Helper()
	done := make(chan error, 1)
	go func() { _, err := reg.Gather(); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gathering: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the scrape hung on an unreachable database")
	}
}

// outageContext bounds a test of an outage: a minute, or the test's own
// deadline less the time to report, whichever comes first; a scrape that
// outlives it hung.
func outageContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if d, ok := t.Deadline(); ok {
		cancel()
		ctx, cancel = context.WithDeadline(context.Background(), d.Add(-5*time.Second))
	}
	t.Cleanup(cancel)
	return ctx
}

// outage is a scrape of a collector whose database went away, and what
// the test checks of it.
type outage struct {
	reg    prometheus.Gatherer
	coll   interface{ Err() error }
	up     string            // the collector's up gauge
	labels map[string]string // its labels
	// during checks the rest while the database is away; i is the
	// fault's index. after, when set, checks the recovery.
	during func(t *testing.T, i int)
	after  func(t *testing.T)
}

// duringOutages runs o in a subtest for each way a database host goes
// away: a proxy that goes silent (freeze), then one that also cuts every
// connection (stop). Each scrapes through the fault, which must answer
// with the read failed and up 0, then restores the proxy and scrapes
// again, which must give up 1.
func duringOutages(ctx context.Context, t *testing.T, proxy *netfault.Proxy, o outage) {
	t.Helper()
	for i, fault := range []struct {
		name string
		do   func()
	}{{"freeze", proxy.Freeze}, {"stop", proxy.Stop}} {
		t.Run(fault.name, func(t *testing.T) {
			fault.do()
			gatherWithin(ctx, t, o.reg)
			if o.coll.Err() == nil {
				t.Fatal("the read succeeded through a dead database")
			}
			if up, ok := value(t, o.reg, o.up, o.labels); !ok || up != 0 {
				t.Errorf("during the outage: %s %v (%v), want 0", o.up, up, ok)
			}
			o.during(t, i)
			proxy.Restore()
			gatherWithin(ctx, t, o.reg)
			if up, _ := value(t, o.reg, o.up, o.labels); up != 1 {
				t.Errorf("after the outage: %s %v (%v)", o.up, up, o.coll.Err())
			}
			if o.after != nil {
				o.after(t)
			}
		})
	}
}

// TestInboxCollectorDatabaseGone scrapes an inbox whose database stops
// answering (a proxy that goes silent, then one that cuts every
// connection): the scrape answers, with the read counted as an error and
// the per-consumer series withdrawn, and recovers when the database is
// back.
func TestInboxCollectorDatabaseGone(t *testing.T) {
	ctx := outageContext(t)
	pool, proxy := pgtest.PoolBehindFault(t)
	store := migrated(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('ledger', 'k', 'k', '\x00')`); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	coll := idemprom.NewInboxCollector(store, "idem_inbox", &idemprom.InboxOptions{Interval: -1, Timeout: time.Second, CountInterval: -1, CountTimeout: time.Second})
	reg.MustRegister(coll)
	if err := coll.Count(ctx); err != nil {
		t.Fatal(err)
	}
	gatherWithin(ctx, t, reg)
	if up, _ := value(t, reg, "idem_inbox_stats_up", nil); up != 1 {
		t.Fatalf("before the outage: up %v (%v)", up, coll.Err())
	}

	duringOutages(ctx, t, proxy, outage{
		reg: reg, coll: coll, up: "idem_inbox_stats_up",
		during: func(t *testing.T, i int) {
			if _, ok := value(t, reg, "idem_inbox_consumer_headroom_seconds", nil); ok {
				t.Error("per-consumer series still exported while they cannot be read")
			}
			// Every gather above read once more.
			errs, _ := value(t, reg, "idem_inbox_scrape_errors_total", map[string]string{"read": "oldest"})
			if min := float64(2*i + 1); errs < min {
				t.Errorf("idem_inbox_scrape_errors_total{read=oldest} = %v, want at least %v", errs, min)
			}
			if err := coll.Count(ctx); err == nil {
				t.Fatal("the markers were counted through a dead database")
			}
			if _, ok := value(t, reg, "idem_inbox_consumer_markers", nil); ok {
				t.Error("markers still exported after a failed count")
			}
			if errs, _ := value(t, reg, "idem_inbox_scrape_errors_total", map[string]string{"read": "markers"}); errs != float64(i+1) {
				t.Errorf("idem_inbox_scrape_errors_total{read=markers} = %v, want %v", errs, i+1)
			}
		},
		after: func(t *testing.T) {
			if err := coll.Count(ctx); err != nil {
				t.Fatal(err)
			}
			if markers, _ := value(t, reg, "idem_inbox_consumer_markers", nil); markers != 1 {
				t.Errorf("after the outage: %v markers, want 1", markers)
			}
		},
	})
}
