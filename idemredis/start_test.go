package idemredis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// refusedWithin runs c and returns the error Run refused to start with.
func refusedWithin(t *testing.T, c interface{ Run(context.Context) error }) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.Run(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Run = %v; want it to refuse to start", err)
	}
	return err
}

// Run refuses to start without its group (unless GroupStart creates it)
// and without a dead-letter stream that is a stream, and reads nothing
// then; New refuses a configuration without stream or group.
func TestRefusesToStart(t *testing.T) {
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	_, store := inbox(t, pgtest.Schema(t))
	proc := processor(t, store)
	ctx := context.Background()
	if _, err := idemredis.New(rdb, proc, &idemredis.Config{Stream: stream}); !errors.Is(err, idemredis.ErrConfig) {
		t.Errorf("New without a group = %v; want ErrConfig", err)
	}
	publish(t, rdb, stream, "m", 1)
	newC := func(cfg idemredis.Config) *idemredis.Consumer[pgx.Tx] {
		cfg.Stream, cfg.Logger = stream, quiet(t)
		c, err := idemredis.New(rdb, proc, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if err := refusedWithin(t, newC(idemredis.Config{Group: "g", CreateDeadLetterStream: true})); !errors.Is(err, idemredis.ErrNoGroup) {
		t.Errorf("Run without the group = %v; want ErrNoGroup", err)
	} else {
		t.Logf("refused: %v", err)
	}
	if err := rdb.Set(ctx, stream+".dlq", "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	err := refusedWithin(t, newC(idemredis.Config{Group: "g", GroupStart: "0", CreateDeadLetterStream: true}))
	if !errors.Is(err, idemredis.ErrDeadLetterStream) || !strings.Contains(err.Error(), "is a string") {
		t.Errorf("Run with a dead-letter key of another type = %v; want ErrDeadLetterStream naming it", err)
	}
	if p := pending(t, rdb, stream, "g"); p != 0 {
		t.Errorf("%d entries read by consumers that refused to start", p)
	}
}

// A consumer that holds pending entries is not deleted (Redis would drop
// its entries from the pending list); once they are acked, it is.
func TestDeleteConsumerRefusedWithPending(t *testing.T) {
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	publish(t, rdb, stream, "m", 2)
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "ghost", Streams: []string{stream, ">"}, Count: 2, Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	err = idemredis.DeleteConsumer(ctx, rdb, stream, "g", "ghost")
	if !errors.Is(err, idemredis.ErrConsumerPending) {
		t.Fatalf("DeleteConsumer of a consumer with 2 pending entries = %v; want ErrConsumerPending", err)
	}
	if p := pending(t, rdb, stream, "g"); p != 2 {
		t.Fatalf("%d entries pending after the refused delete; want 2", p)
	}
	for _, m := range res[0].Messages {
		if err := rdb.XAck(ctx, stream, "g", m.ID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := idemredis.DeleteConsumer(ctx, rdb, stream, "g", "ghost"); err != nil {
		t.Fatalf("DeleteConsumer of a consumer with nothing pending = %v", err)
	}
	cs, err := rdb.XInfoConsumers(ctx, stream, "g").Result()
	if err != nil || len(cs) != 0 {
		t.Fatalf("consumers after the delete: %v, %v; want none", cs, err)
	}
}

// Entries trimmed from the stream (XTRIM MAXLEN 0) before the group read
// them, and pending entries of a dead consumer trimmed with them, are
// reported: Durability names the trim past the group's position, and the
// consumer counts the pending entries it found deleted (Stats.Trimmed)
// and clears them from the pending list.
func TestTrimmedEntriesReported(t *testing.T) {
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, rdb, stream+".dlq"); err != nil {
		t.Fatal(err)
	}
	publish(t, rdb, stream, "m", 10)
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "ghost", Streams: []string{stream, ">"}, Count: 5, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XTrimMaxLen(ctx, stream, 0).Err(); err != nil {
		t.Fatal(err)
	}
	pool, store := inbox(t, pgtest.Schema(t))
	c, err := idemredis.New(rdb, processor(t, store), &idemredis.Config{
		Stream: stream, Group: "g", ClaimIdle: 100 * time.Millisecond, Block: 100 * time.Millisecond, Logger: quiet(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Durability(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range d.Risks {
		t.Logf("risk: %s", r)
		found = found || strings.Contains(r.What, "deleted or trimmed")
	}
	if !found {
		t.Errorf("Durability risks %v; want the trim past the group's position", d.Risks)
	}
	run(t, c)
	waitFor(t, 30*time.Second, "the trimmed pending entries counted", func() bool { return c.Stats().Trimmed >= 5 })
	if p := pending(t, rdb, stream, "g"); p != 0 {
		t.Errorf("%d entries pending; want the deleted ones cleared", p)
	}
	if n := len(effects(t, pool)); n != 0 {
		t.Errorf("%d effects of trimmed entries", n)
	}
	if h := c.Health(); !strings.Contains(h.LastError, "deleted or trimmed") {
		t.Errorf("Health().LastError = %q; want the lost entries named", h.LastError)
	}
}

// While the inbox database is away, entries stay pending with the
// consumer: none is dead-lettered, Health says it holds them and is not
// ready; once the database is back every entry is applied once.
func TestHealthHoldingDuringDatabaseOutage(t *testing.T) {
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, rdb, stream+".dlq"); err != nil {
		t.Fatal(err)
	}
	url, proxy := pgtest.SchemaBehindFault(t)
	pool, store := inbox(t, url)
	c, err := idemredis.New(rdb, processor(t, store), &idemredis.Config{
		Stream: stream, Group: "g", ClaimIdle: 300 * time.Millisecond, Block: 100 * time.Millisecond,
		Backoff: idem.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}, Logger: quiet(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	ids := publish(t, rdb, stream, "before", 1)
	waitFor(t, 30*time.Second, "the first entry acked", func() bool { return c.Stats().Applied == 1 })
	waitFor(t, 30*time.Second, "Health's lag (as of the last claim scan) at 0", func() bool { return c.Health().TotalLag == 0 })
	proxy.Stop()
	ids = append(ids, publish(t, rdb, stream, "during", 5)...)
	waitFor(t, 30*time.Second, "Health to say the consumer holds entries", func() bool { return c.Health().Holding })
	h := c.Health()
	t.Logf("during the outage: holding since %v: %s", h.HoldingSince, h.HoldReason)
	if h.Ready() == nil {
		t.Error("Health().Ready() = nil while entries are held")
	}
	if p := pending(t, rdb, stream, "g"); p == 0 {
		t.Error("no entry pending while the database is away")
	}
	proxy.Restore()
	waitFor(t, 30*time.Second, "every entry applied and acked", func() bool {
		return c.Stats().Applied == uint64(len(ids)) && pending(t, rdb, stream, "g") == 0
	})
	if c.Health().Holding {
		t.Error("Health still holding after every entry was acked")
	}
	got := effects(t, pool)
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("%s applied %d times; want once", id, got[id])
		}
	}
	if n, _ := rdb.XLen(ctx, stream+".dlq").Result(); n != 0 || c.Stats().DeadLettered != 0 {
		t.Errorf("%d dead letters; want none: an outage is no entry's fault", n)
	}
}

// A consumer stopped with nothing pending leaves its group; the group's
// entries stay acked.
func TestGracefulStopLeavesGroup(t *testing.T) {
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, rdb, stream+".dlq"); err != nil {
		t.Fatal(err)
	}
	_, store := inbox(t, pgtest.Schema(t))
	c, err := idemredis.New(rdb, processor(t, store), &idemredis.Config{Stream: stream, Group: "g", Block: 100 * time.Millisecond, Logger: quiet(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	publish(t, rdb, stream, "m", 3)
	waitFor(t, 30*time.Second, "3 entries applied", func() bool { return c.Stats().Applied == 3 })
	cs, err := rdb.XInfoConsumers(ctx, stream, "g").Result()
	if err != nil || len(cs) != 1 || cs[0].Name != c.Name() {
		t.Fatalf("consumers while running: %+v, %v; want %s", cs, err, c.Name())
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if cs, err := rdb.XInfoConsumers(ctx, stream, "g").Result(); err != nil || len(cs) != 0 {
		t.Fatalf("consumers after a graceful stop: %+v, %v; want none", cs, err)
	}
}
