package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/pgxinbox"
)

// Redis: list, show, purge and a redrive of a dead-letter stream, named
// with --stream and --redis; --stream with another DLQ is a usage error.
// (A letter whose origin entry is years old is refused as expired: the
// original entry's time is its event time.)
func TestDLQCommandsRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Client(t)
	p := redistest.Prefix(t, rdb)
	stream, dlqStream := p+"orders", p+"orders.dlq"
	if err := rdb.XGroupCreateMkStream(ctx, stream, "orders-ship", "$").Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ord-1", "ord-2", "ord-3"} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: dlqStream, Values: []any{
			idemredis.DefaultIDField, id, idemredis.DefaultBodyField, `{}`,
			idembroker.HeaderReason, "carrier unknown", idembroker.HeaderConsumer, "orders-ship",
			idembroker.HeaderAttempts, "1", idembroker.HeaderOrigin, fmt.Sprintf("%s/%d-0", stream, time.Now().UnixMilli()),
		}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	db := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	r := []string{"--stream", dlqStream, "--redis", "redis://" + redistest.Addr() + "/0"}
	out, _ := dlqRun(t, 0, append([]string{"list"}, r...)...)
	if !strings.Contains(out, "redis stream "+dlqStream+": 3 dead letters") || !strings.Contains(out, "carrier unknown") {
		t.Fatalf("list: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"show", "--id", "ord-2", "--database", db, "--key", "id"}, r...)...)
	if !strings.Contains(out, "ord-2") || !strings.Contains(out, stream) {
		t.Fatalf("show: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"purge", "--apply", "--id", "ord-3"}, r...)...)
	t.Logf("purge: %s", out)
	out, _ = dlqRun(t, 0, append([]string{"redrive", "--apply", "--database", db, "--key", "id"}, r...)...)
	if !strings.Contains(out, "redriven 2 of 2") {
		t.Fatalf("redrive: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"list"}, r...)...)
	if !strings.Contains(out, "0 dead letters") {
		t.Fatalf("list after redrive: %s", out)
	}
	if n, err := rdb.XLen(ctx, stream).Result(); err != nil || n != 2 {
		t.Fatalf("%s holds %d entries (%v), want the 2 redriven", stream, n, err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: dlqStream, Values: []any{
		idemredis.DefaultIDField, "ord-old", idembroker.HeaderReason, "carrier unknown", idembroker.HeaderConsumer, "orders-ship",
		idembroker.HeaderOrigin, stream + "/1700000000000-0",
	}}).Err(); err != nil {
		t.Fatal(err)
	}
	out, _ = dlqRun(t, 1, append([]string{"redrive", "--apply", "--database", db, "--key", "id"}, r...)...)
	if !strings.Contains(out, "expire") {
		t.Fatalf("redrive of a letter from 2023: %s", out)
	}
	dlqRun(t, 2, "list", "--queue", "a", "--stream", "b")
}
