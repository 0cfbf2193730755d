package idemrabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/pgxinbox"
)

// outcomes records every result the processor reports, by message.
type outcomes struct {
	mu   sync.Mutex
	seen map[string][]idem.Result
}

func newOutcomes() *outcomes { return &outcomes{seen: map[string][]idem.Result{}} }

func (o *outcomes) OnOutcome(_ string, r idem.Result, _ time.Duration) {
	o.mu.Lock()
	o.seen[r.MessageID] = append(o.seen[r.MessageID], r)
	o.mu.Unlock()
}

// count is how many results matched f.
func (o *outcomes) count(f func(idem.Result) bool) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, rs := range o.seen {
		for _, r := range rs {
			if f(r) {
				n++
			}
		}
	}
	return n
}

// mostHeld is the most held (Blameless Retry) results of one message.
func (o *outcomes) mostHeld() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	most := 0
	for _, rs := range o.seen {
		n := 0
		for _, r := range rs {
			if r.Outcome == idem.Retry && r.Blameless {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

func (o *outcomes) first(id string) (idem.Result, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if rs := o.seen[id]; len(rs) > 0 {
		return rs[0], true
	}
	return idem.Result{}, false
}

// The connection drops while a batch is in the handler. The batch goes on
// to its commit (it used to be cancelled, rolled back and logged once per
// message); its redeliveries are duplicates.
func TestConnectionLossLetsInFlightBatchesCommit(t *testing.T) {
	t.Parallel()
	const n = 40
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		once.Do(func() {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
		return write(ctx, tx, m)
	}
	obs := newOutcomes()
	proc := d.processor(t, h, func(c *idem.Config[pgx.Tx]) {
		c.Logger = logger
		c.Hooks = append(c.Hooks, obs)
	})
	publish(t, conn, topo.Queue, 0, n, msgID)
	cfg := config(t, topo.Queue)
	cfg.BatchSize, cfg.BatchWait = n, 200*time.Millisecond // one batch
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}
	if !c.DropConnection() {
		t.Fatal("no connection to drop")
	}
	close(release)
	rec.waitUntil(t, 30*time.Second, "every message acked after the reconnect", func() bool { return rec.distinctAcked() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("stats %+v", st)
	for i := range n {
		if r, _ := obs.first(msgID(i)); r.Outcome != idem.Applied {
			t.Fatalf("%s: first outcome %v (%v), want Applied: the batch in flight was cancelled by the connection loss", msgID(i), r.Outcome, r.Err)
		}
	}
	if k := obs.count(func(r idem.Result) bool { return r.Outcome == idem.Retry }); k != 0 {
		t.Fatalf("%d Retry outcomes, want none", k)
	}
	if st.Duplicates != n || st.Reconnects != 1 {
		t.Fatalf("stats %+v, want the %d redeliveries acked as duplicates after one reconnect", st, n)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
	if k := strings.Count(logs.String(), "level=WARN"); k > 2 {
		t.Fatalf("%d warnings for one connection loss:\n%s", k, logs.String())
	}
}

// A consumer over an inbox that was never migrated refuses to start, with
// the fix, instead of dead-lettering every message.
func TestRunRefusesMissingInboxTable(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	store, err := pgxinbox.New(d.pool, &pgxinbox.Config{Table: "never_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{Consumer: "billing-invoice", Key: idem.ByMessageID, Handler: write, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, conn, topo.Queue, 0, 3, msgID)
	c, err := idemrabbitmq.NewConsumer(proc, config(t, topo.Queue))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if !errors.Is(err, idem.ErrInboxNotReady) || !strings.Contains(err.Error(), "migrate") {
		t.Fatalf("Run = %v, want an error wrapping idem.ErrInboxNotReady with the fix", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run waited for its context instead of refusing")
	}
	if q := depth(t, conn, topo.Queue); q != 3 || c.Stats().Delivered != 0 {
		t.Fatalf("queue holds %d, %d delivered: the consumer took messages", q, c.Stats().Delivered)
	}
	if dl := drain(t, conn, topo.DeadLetterQueue); len(dl) != 0 {
		t.Fatalf("%d messages dead-lettered", len(dl))
	}
}

// The inbox table is dropped while the consumer runs (a botched deploy):
// the messages are held, none is dead-lettered or requeued, and once the
// table is back (migrated again) every message is applied once.
func TestInboxTableDroppedWhileRunning(t *testing.T) {
	t.Parallel()
	const n = 60
	conn := broker(t)
	topo := topology(t, conn, &idemrabbitmq.TopologyOptions{DeliveryLimit: 2})
	d := newDB(t, uniqueName(t))
	obs := newOutcomes()
	proc := d.processor(t, nil, func(c *idem.Config[pgx.Tx]) {
		c.Retry = idem.RetryPolicy{Backoff: idem.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}, WaitUnavailable: 100 * time.Millisecond}
		c.Hooks = append(c.Hooks, obs)
	})
	cfg := config(t, topo.Queue)
	cfg.BatchSize = 10
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	publish(t, conn, topo.Queue, 0, 10, msgID)
	rec.waitUntil(t, 30*time.Second, "the first 10 acked", func() bool { return rec.distinctAcked() == 10 })
	ctx := context.Background()
	// Every inbox table of the schema goes: the inbox and its bookkeeping
	// (a Migrate would otherwise find its versions recorded and not
	// create the inbox again).
	if _, err := d.pool.Exec(ctx, `DO $$ DECLARE r record; BEGIN
		FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'idem%' LOOP
			EXECUTE format('DROP TABLE %I CASCADE', r.tablename);
		END LOOP; END $$`); err != nil {
		t.Fatal(err)
	}
	publish(t, conn, topo.Queue, 10, n-10, msgID)
	poll(t, 30*time.Second, "a message held three times", func() bool { return obs.mostHeld() >= 3 })
	if st := c.Stats(); st.DeadLettered != 0 || st.Requeued != 0 || rec.distinctAcked() != 10 {
		t.Fatalf("stats %+v with the table missing: nothing may be settled", st)
	}
	store, err := pgxinbox.New(d.pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rec.waitUntil(t, 30*time.Second, "every message acked", func() bool { return rec.distinctAcked() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("stats %+v; most holds of one message %d", st, obs.mostHeld())
	if dl := drain(t, conn, topo.DeadLetterQueue); len(dl) != 0 || st.DeadLettered != 0 || st.Requeued != 0 {
		t.Fatalf("%d dead-lettered, stats %+v: a missing table is not the messages' fault", len(dl), st)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
}

// The database stops answering (connections accepted, nothing forwarded:
// a half-open network, a hung server) and new connections time out
// (connect_timeout=1). Healthy messages are held, never dead-lettered, and
// all applied once the database answers again.
func TestDatabaseStopsAnswering(t *testing.T) {
	t.Parallel()
	const n = 200
	conn := broker(t)
	topo := topology(t, conn, &idemrabbitmq.TopologyOptions{DeliveryLimit: 2})
	d := newDB(t, uniqueName(t))
	pool, proxy := d.poolVia(t, "connect_timeout=1")
	obs := newOutcomes()
	proc := d.processorOn(t, pool, nil, func(c *idem.Config[pgx.Tx]) {
		c.Retry = idem.RetryPolicy{Backoff: idem.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}, WaitUnavailable: 300 * time.Millisecond}
		c.TxTimeout, c.CommitTimeout = time.Second, time.Second
		c.Hooks = append(c.Hooks, obs)
	})
	publish(t, conn, topo.Queue, 0, n, msgID)
	cfg := config(t, topo.Queue)
	cfg.BatchSize, cfg.Workers = 20, 2
	cfg.ShutdownGrace = 2 * time.Second
	rec := newSettlements()
	cfg.Hooks = []idem.Hook{rec}
	c, err := idemrabbitmq.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	rec.waitUntil(t, 30*time.Second, "60 acked", func() bool { return rec.distinctAcked() >= 60 })
	proxy.Freeze()
	poll(t, 30*time.Second, "a message held three times", func() bool { return obs.mostHeld() >= 3 })
	proxy.Restore()
	// The silent connections were given up on; let the pool make new ones.
	rec.waitUntil(t, 30*time.Second, "every message settled", func() bool { return rec.distinctAcked()+rec.deadLettered() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("stats %+v; most holds of one message %d", st, obs.mostHeld())
	if dl := drain(t, conn, topo.DeadLetterQueue); len(dl) != 0 || st.DeadLettered != 0 {
		reason := ""
		if len(dl) > 0 {
			reason = fmt.Sprint(dl[0].Headers[idembroker.HeaderReason])
		}
		t.Fatalf("%d healthy messages dead-lettered by the outage (stats %+v); first reason: %s", len(dl), st, reason)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects %d (%d distinct), want %d", rows, distinct, n)
	}
	var unknown atomic.Int64
	unknown.Store(int64(obs.count(func(r idem.Result) bool { return errors.Is(r.Err, idem.ErrCommitUnknown) })))
	if st.Requeued > uint64(cfg.Workers*cfg.BatchSize) {
		t.Fatalf("stats %+v: an outage may requeue at most the batches whose COMMIT it caught (%d commits unknown)", st, unknown.Load())
	}
}

// A consumer whose database user may read the inbox but not write it
// (42501) refuses to start, instead of dead-lettering every message.
func TestRunRefusesReadOnlyInbox(t *testing.T) {
	t.Parallel()
	conn := broker(t)
	topo := topology(t, conn, nil)
	d := newDB(t, uniqueName(t))
	d.processor(t, nil) // migrates the inbox as the owner
	ctx := context.Background()
	role := "idem_reader_" + randomHex(4)
	var schema string
	if err := d.pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + pgx.Identifier{schema}.Sanitize() + ` TO ` + role,
		`GRANT SELECT ON ALL TABLES IN SCHEMA ` + pgx.Identifier{schema}.Sanitize() + ` TO ` + role,
	} {
		if _, err := d.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := d.pool.Exec(context.Background(), q); err != nil {
				t.Logf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(d.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{Consumer: "billing-invoice", Key: idem.ByMessageID, Handler: write, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, conn, topo.Queue, 0, 3, msgID)
	c, err := idemrabbitmq.NewConsumer(proc, config(t, topo.Queue))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Run(rctx); !errors.Is(err, idem.ErrInboxNotReady) || rctx.Err() != nil {
		t.Fatalf("Run = %v, want an error wrapping idem.ErrInboxNotReady at once", err)
	}
	if q := depth(t, conn, topo.Queue); q != 3 || c.Stats().Delivered != 0 {
		t.Fatalf("queue holds %d, %d delivered: the consumer took messages", q, c.Stats().Delivered)
	}
}
