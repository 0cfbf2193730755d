package idemredis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// An event-time field that does not parse dead-letters an entry whose ID
// carries no time (idem.ErrBadTime, decided by the processor), and is
// ignored on a UUIDv7 ID; the dead letter carries the original fields and
// an envelope that idembroker.ReadEnvelope reads back.
func TestBadTimeAndEnvelope(t *testing.T) {
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	pool, store := inbox(t, pgtest.Schema(t))
	ctx := context.Background()
	v7 := idem.NewUUIDv7(time.Now())
	for _, id := range []string{"plain-1", v7} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
			idemredis.DefaultIDField, id, idemredis.DefaultBodyField, "b", idemredis.DefaultTimeField, "yesterday",
			idemredis.FieldTraceParent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c, err := idemredis.New(rdb, processor(t, store), &idemredis.Config{Stream: stream, Group: "g", GroupStart: "0",
		CreateDeadLetterStream: true, Block: 100 * time.Millisecond, Logger: quiet(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, 60*time.Second, "both entries settled", func() bool {
		n, _ := rdb.XLen(ctx, stream+".dlq").Result()
		return n == 1 && len(effects(t, pool)) == 1 && pending(t, rdb, stream, "g") == 0
	})
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if e := effects(t, pool); e[v7] != 1 || e["plain-1"] != 0 {
		t.Errorf("effects %v; want the UUIDv7 entry applied once and the other not", e)
	}
	letters, err := rdb.XRange(ctx, stream+".dlq", "-", "+").Result()
	if err != nil || len(letters) != 1 {
		t.Fatalf("dead letters %v %v", letters, err)
	}
	f := map[string]string{}
	for k, v := range letters[0].Values {
		f[k], _ = v.(string)
	}
	env := idembroker.ReadEnvelope(f)
	if f[idemredis.DefaultIDField] != "plain-1" || f[idemredis.FieldTraceParent] == "" || f[idemredis.FieldDeliveries] != "1" ||
		!strings.Contains(env.Reason, idem.ErrBadTime.Error()) || env.Outcome != "dead_lettered" || env.Consumer != "redis-test" ||
		!strings.HasPrefix(env.Origin, stream+"/") {
		t.Errorf("dead letter fields %v, envelope %+v", f, env)
	}
	if s := c.Stats(); s.DeadLettered != 1 {
		t.Errorf("Stats.DeadLettered = %d; want 1", s.DeadLettered)
	}
}
