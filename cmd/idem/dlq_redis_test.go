package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
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

// The console serves a Redis dead-letter stream given with --stream: its
// letters are listed, and the page read left them in the stream.
func TestConsoleServesRedis(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	p := redistest.Prefix(t, rdb)
	dlqStream := p + "billing.dlq"
	bg := context.Background()
	for _, id := range []string{"inv-1", "inv-2"} {
		if err := rdb.XAdd(bg, &redis.XAddArgs{Stream: dlqStream, Values: []any{
			idemredis.DefaultIDField, id, idemredis.DefaultBodyField, `{}`,
			idembroker.HeaderReason, "handling message " + id + ": tax rate missing", idembroker.HeaderConsumer, "billing-invoice",
			idembroker.HeaderOrigin, fmt.Sprintf("%sbilling/%d-0", p, time.Now().UnixMilli()),
		}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	db := pgtest.Schema(t)
	pool, err := pgxpool.New(bg, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(bg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
	defer cancel()
	ctx, stop := context.WithCancel(ctx)
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"console", "--key", "id", "--database", db, "--listen", "127.0.0.1:0",
			"--stream", dlqStream, "--redis", "redis://" + redistest.Addr() + "/0"}, &out, &errb)
	}()
	var base string
	for deadline := time.Now().Add(time.Minute); base == ""; {
		if m := regexp.MustCompile(`serving (http://[^/]+)/`).FindStringSubmatch(out.String()); m != nil {
			base = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("idem console exited %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("idem console did not serve within a minute\nstdout: %s\nstderr: %s", out.String(), errb.String())
		}
	}
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `<span class="total">2</span> letters`) || !strings.Contains(string(page), dlqStream) {
		t.Fatalf("GET /: %d\n%s", resp.StatusCode, page)
	}
	if n, err := rdb.XLen(bg, dlqStream).Result(); err != nil || n != 2 {
		t.Fatalf("%d letters after the page (%v), want 2", n, err)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("idem console exited %d after its cancel\nstderr: %s", code, errb.String())
	}
}
