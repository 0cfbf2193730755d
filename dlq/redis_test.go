package dlq

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/pgxinbox"
)

// The Redis round: a consumer whose handler fails permanently fills the
// dead-letter stream; list groups the letters and show judges one, both
// leaving the stream as it was; a dry run changes nothing; a redrive sends
// letters back to their origin stream and deletes them, a purge deletes
// one; the fixed consumer applies each redriven message exactly once, and
// the purged one never.
func TestRedisListShowRedrivePurge(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	ids := []string{"ord-1", "ord-2", "ord-3"}
	for _, id := range ids {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
			idemredis.DefaultIDField, id, idemredis.DefaultBodyField, `{"order":"` + id + `"}`, idemredis.DefaultKeyField, "k",
		}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	pool := pgtest.PoolOf(t, 0)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// consume runs a consumer until until() holds.
	consume := func(broken bool, until func(*outcomes) bool) *outcomes {
		t.Helper()
		o := &outcomes{}
		proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
			Consumer: "orders-ship", Key: idem.ByMessageID, Hooks: []idem.Hook{o},
			Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
				if broken {
					return idem.Permanent(errors.New("carrier unknown for order " + m.ID))
				}
				_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
				return err
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		cons, err := idemredis.New(rdb, proc, &idemredis.Config{Stream: stream, Group: "orders-ship", GroupStart: "0",
			CreateDeadLetterStream: true, Block: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- cons.Run(rctx) }()
		for !until(o) {
			select {
			case err := <-errc:
				stop()
				t.Fatalf("consumer stopped: %v", err)
			case <-ctx.Done():
				stop()
				t.Fatalf("consumer: %d outcomes when the test timed out", o.count())
			case <-time.After(20 * time.Millisecond):
			}
		}
		stop()
		if err := <-errc; err != nil {
			t.Fatalf("consumer: %v", err)
		}
		return o
	}
	dlqStream := stream + ".dlq"
	xlen := func() int64 {
		n, err := rdb.XLen(ctx, dlqStream).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	consume(true, func(*outcomes) bool { return xlen() == 3 })

	src, err := NewRedis(ctx, RedisConfig{URL: "redis://" + redistest.Addr() + "/0", Stream: dlqStream})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ls, err := List(ctx, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Total != 3 || len(ls.Groups) != 1 || ls.Groups[0].Consumer != "orders-ship" || !strings.Contains(ls.Groups[0].Reason, "carrier unknown for order <id>") {
		t.Fatalf("listing %+v", ls)
	}
	in, err := NewInbox(pool, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := Show(ctx, src, in, "ord-2")
	if err != nil {
		t.Fatal(err)
	}
	if sh.Judgement.Verdict != Apply || sh.Letter.Target != stream || sh.Letter.Key != "k" || string(sh.Letter.Body) != `{"order":"ord-2"}` ||
		sh.Letter.Attempts < 1 || sh.Letter.Outcome != "dead_lettered" || sh.Letter.Headers[idemredis.FieldDeliveries] != "1" || sh.Letter.TimeFrom != "broker" {
		t.Fatalf("show %+v %+v", sh.Letter, sh.Judgement)
	}
	// Reading is free: the letters are where they were, no group was made.
	if n := xlen(); n != 3 {
		t.Fatalf("%d letters after list and show, want 3", n)
	}
	if gs, err := rdb.XInfoGroups(ctx, dlqStream).Result(); err != nil || len(gs) != 0 {
		t.Fatalf("groups of the dead-letter stream after reading: %v %v", gs, err)
	}

	res, err := Redrive(ctx, src, in, Selection{})
	if err != nil || res.Matched != 3 || res.Done != 0 || xlen() != 3 {
		t.Fatalf("dry run %+v %v", res, err)
	}
	res, err = Purge(ctx, src, in, Selection{Filter: Filter{IDs: []string{"ord-3"}}, Apply: true})
	if err != nil || res.Done != 1 || xlen() != 2 {
		t.Fatalf("purge %+v %v", res, err)
	}
	res, err = Redrive(ctx, src, in, Selection{Apply: true})
	if err != nil || res.Done != 2 || xlen() != 0 {
		t.Fatalf("redrive %+v %v", res, err)
	}
	// The redriven entries carry the ID, the original entry's time and the
	// redrive count, not the dead-letter fields.
	last, err := rdb.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil || len(last) != 1 {
		t.Fatalf("last entry of %s: %v %v", stream, last, err)
	}
	f := last[0].Values
	if f[idemredis.DefaultIDField] == "" || f[idembroker.HeaderRedriven] != "1" || f[idembroker.HeaderReason] != nil || f[idembroker.HeaderOrigin] != nil ||
		f[idemredis.FieldDeliveries] != nil || f[idemredis.DefaultTimeField] == nil {
		t.Fatalf("redriven entry fields %v", f)
	}

	o := consume(false, func(o *outcomes) bool { return o.count() >= 2 })
	for id, want := range map[string]int{"ord-1": 1, "ord-2": 1, "ord-3": 0} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("%s applied %d times, want %d (outcomes %v)", id, n, want, o.m[id])
		}
	}
	if p, err := rdb.XPending(ctx, stream, "orders-ship").Result(); err != nil || p.Count != 0 {
		t.Fatalf("pending after the redriven entries were applied: %+v %v", p, err)
	}
}

// Two redrives of one dead-letter stream at once send each letter once:
// the script copies a letter only while it is still in the stream.
func TestRedisConcurrentRedrivesSendOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rdb := redistest.Client(t)
	p := redistest.Prefix(t, rdb)
	stream, dlqStream := p+"orders", p+"orders.dlq"
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "$").Err(); err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := range n {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: dlqStream, Values: []any{
			idemredis.DefaultIDField, "ord-" + strconv.Itoa(i), idembroker.HeaderReason, "boom",
			idembroker.HeaderConsumer, "c", idembroker.HeaderOrigin, stream + "/" + strconv.FormatInt(time.Now().UnixMilli(), 10) + "-0",
		}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	results := make([]Result, 2)
	errs := make([]error, 2)
	for w := range 2 {
		src, err := NewRedis(ctx, RedisConfig{Client: rdb, Stream: dlqStream})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[w], errs[w] = Redrive(ctx, src, nil, Selection{Apply: true})
		}()
	}
	wg.Wait()
	for w := range 2 {
		if errs[w] != nil {
			t.Fatalf("redrive %d: %v", w, errs[w])
		}
	}
	if got := results[0].Done + results[1].Done; got != n {
		t.Errorf("redrives report %d+%d letters done; want %d in all", results[0].Done, results[1].Done, n)
	}
	if l, _ := rdb.XLen(ctx, dlqStream).Result(); l != 0 {
		t.Errorf("%d letters left", l)
	}
	if l, _ := rdb.XLen(ctx, stream).Result(); l != n {
		t.Errorf("%s holds %d entries; want each of the %d letters once", stream, l, n)
	}
}
