package idemredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// A Redis server killed with SIGKILL in the middle of a stream and
// started again (appendonly yes, appendfsync always: every XADD it
// answered is on disk) costs nothing: the consumer holds what it has
// while Redis is away (its XACKs and reads fail and are tried again;
// nothing is dead-lettered), its health says it is disconnected, and
// once Redis is back every entry published is applied exactly once and
// acked. Nothing lost, nothing doubled.
func TestRedisKilledAndRestarted(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(&redis.Options{DialTimeout: time.Second, MaxRetries: 1})
	ctx := context.Background()
	const stream, group = "orders", "g"
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, rdb, stream+".dlq"); err != nil {
		t.Fatal(err)
	}
	pool, store := inbox(t, pgtest.Schema(t))
	before := publish(t, rdb, stream, "before", 150)

	c, err := idemredis.New(rdb, processor(t, store), &idemredis.Config{
		Stream: stream, Group: group, BatchSize: 10, Block: 200 * time.Millisecond, ClaimIdle: 2 * time.Second,
		Backoff: idem.Backoff{Initial: 20 * time.Millisecond, Max: 300 * time.Millisecond}, Logger: quiet(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, 60*time.Second, "some entries applied", func() bool { return len(effects(t, pool)) >= 30 })

	srv.Kill()
	applied := len(effects(t, pool))
	waitFor(t, 60*time.Second, "the consumer's health to say Redis is away", func() bool { return !c.Health().Connected })
	t.Logf("Redis killed with %d of %d entries applied; health: %+v", applied, len(before), c.Health())
	if c.Health().Ready() == nil {
		t.Error("Health().Ready() = nil while Redis is away")
	}
	srv.Restart()

	after := publish(t, rdb, stream, "after", 50)
	all := append(before, after...)
	waitFor(t, 90*time.Second, "every entry applied and acked", func() bool {
		return len(effects(t, pool)) == len(all) && pending(t, rdb, stream, group) == 0
	})
	waitFor(t, 30*time.Second, "the consumer's health to say Redis is back", func() bool { return c.Health().Connected })
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	got := effects(t, pool)
	lost, doubled := 0, 0
	for _, id := range all {
		switch {
		case got[id] == 0:
			lost++
		case got[id] > 1:
			doubled++
		}
	}
	s := c.Stats()
	t.Logf("%d entries: %d lost, %d doubled; stats %+v", len(all), lost, doubled, s)
	if lost != 0 || doubled != 0 || len(got) != len(all) {
		t.Errorf("%d lost, %d doubled, %d distinct applied of %d; want every entry once", lost, doubled, len(got), len(all))
	}
	if n, _ := rdb.XLen(ctx, stream+".dlq").Result(); n != 0 || s.DeadLettered != 0 {
		t.Errorf("%d dead letters (%d counted); want none: an outage of Redis is no entry's fault", n, s.DeadLettered)
	}
}
