package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
)

func init() { brokers["redis"] = Redis }

// Redis is the broker of streams read by one consumer group.
func Redis() *Broker {
	return &Broker{
		Name:    "redis",
		Prepare: prepareRedisStream,
		Consumers: []Consumer{
			{Key: "naive", Name: "naive batched (no guard)", Run: redisBatches(NaiveBatch)},
			{Key: "handrolled-msg", Name: "inbox SQL by hand, per message", Guarded: true, Run: redisHandOne},
			{Key: "handrolled-batch", Name: "hand-rolled batched inbox", Guarded: true, Run: redisBatches(HandBatch)},
			{Key: "watermill", Name: "Watermill router + inbox SQL in its handler", Guarded: true, Run: watermillRedis},
			{Key: "idem-msg", Name: "idem per message (Handler)", Guarded: true, Run: redisIdem(false)},
			{Key: "idem-batch", Name: "idem batched (HandleBatch)", Guarded: true, Run: redisIdem(true)},
		},
	}
}

// redisGroup is the consumer group every consumer of the benchmark reads
// its stream in.
const redisGroup = "peers"

// redisBlock is how long an XREADGROUP of every consumer here waits for
// entries when there are none, so that the tail of a run is not a wait.
const redisBlock = 20 * time.Millisecond

// redisClient connects to addr.
func redisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr})
}

// redisVersion is the server's version.
func redisVersion(addr string) string {
	rdb := redisClient(addr)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := rdb.InfoMap(ctx, "server").Result()
	if err != nil {
		return ""
	}
	return info["Server"]["redis_version"]
}

// prepareRedisStream creates the stream peers:<run>, its group at the
// start and its dead-letter stream, and adds w to it, the ID and the body
// in the fields idemredis reads (the others read the same).
func prepareRedisStream(ctx context.Context, opts *Options, run string, w *Workload) (string, func(), error) {
	rdb := redisClient(opts.RedisAddr)
	defer rdb.Close()
	stream := "peers:" + run
	cleanup := func() {
		rdb := redisClient(opts.RedisAddr)
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rdb.Del(ctx, stream, stream+".dlq").Err()
	}
	if err := rdb.XGroupCreateMkStream(ctx, stream, redisGroup, "0").Err(); err != nil {
		return "", nil, fmt.Errorf("Redis at %s: creating stream %s: %w (make services starts it)", opts.RedisAddr, stream, err)
	}
	if err := idemredis.CreateStream(ctx, rdb, stream+".dlq"); err != nil {
		cleanup()
		return "", nil, err
	}
	for i := 0; i < len(w.Msgs); i += 1000 {
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, m := range w.Msgs[i:min(i+1000, len(w.Msgs))] {
				p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
					idemredis.DefaultIDField, m.ID, idemredis.DefaultBodyField, m.Body}})
			}
			return nil
		})
		if err != nil {
			cleanup()
			return "", nil, fmt.Errorf("adding to %s: %w", stream, err)
		}
	}
	return stream, cleanup, nil
}

// redisRead reads up to n new entries of e's stream as consumer name.
func redisRead(ctx context.Context, rdb *redis.Client, e *Env, n int) ([]redis.XMessage, error) {
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: redisGroup, Consumer: "peers",
		Streams: []string{e.Source, ">"}, Count: int64(n), Block: redisBlock}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil || len(res) == 0 {
		return nil, err
	}
	return res[0].Messages, nil
}

func redisMsg(m redis.XMessage) Msg {
	id, _ := m.Values[idemredis.DefaultIDField].(string)
	body, _ := m.Values[idemredis.DefaultBodyField].(string)
	return Msg{ID: id, Body: []byte(body)}
}

// redisBatches is a hand-written batching consumer: XREADGROUP of up to
// e.Batch entries, one call of apply, then one XACK of them all, after the
// commit.
func redisBatches(apply func(context.Context, *pgxpool.Pool, string, []Msg) error) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		rdb := redisClient(e.RedisAddr)
		defer rdb.Close()
		batch := make([]Msg, 0, e.Batch)
		for ctx.Err() == nil {
			ms, err := redisRead(ctx, rdb, e, e.Batch)
			if err != nil {
				return stopped(ctx, err)
			}
			if len(ms) == 0 {
				continue
			}
			batch = batch[:0]
			ids := make([]string, len(ms))
			for i, m := range ms {
				batch, ids[i] = append(batch, redisMsg(m)), m.ID
			}
			if err := apply(ctx, e.Pool, e.Consumer, batch); err != nil {
				return stopped(ctx, err)
			}
			if err := rdb.XAck(ctx, e.Source, redisGroup, ids...).Err(); err != nil {
				return stopped(ctx, err)
			}
			e.Acked(len(ms))
		}
		return nil
	}
}

// redisHandOne is the per-message consumer: the inbox SQL by hand, then
// the entry's own XACK.
func redisHandOne(ctx context.Context, e *Env) error {
	rdb := redisClient(e.RedisAddr)
	defer rdb.Close()
	for ctx.Err() == nil {
		ms, err := redisRead(ctx, rdb, e, e.Batch)
		if err != nil {
			return stopped(ctx, err)
		}
		for _, m := range ms {
			if err := HandOne(ctx, e.Pool, e.Consumer, redisMsg(m)); err != nil {
				return stopped(ctx, err)
			}
			if err := rdb.XAck(ctx, e.Source, redisGroup, m.ID).Err(); err != nil {
				return stopped(ctx, err)
			}
			e.Acked(1)
		}
	}
	return nil
}

// redisIdem is idemredis with the effect through idem.JSON (batch 1) or
// idem.JSONBatch (batches of e.Batch).
func redisIdem(batched bool) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		proc, err := Processor(e.Store, e.Consumer, batched)
		if err != nil {
			return err
		}
		batch := 1
		if batched {
			batch = e.Batch
		}
		rdb := redisClient(e.RedisAddr)
		defer rdb.Close()
		c, err := idemredis.New(rdb, proc, &idemredis.Config{Stream: e.Source, Group: redisGroup, Name: "peers",
			BatchSize: batch, Block: redisBlock, Hooks: []idem.Hook{settled{e}}, Logger: quiet})
		if err != nil {
			return err
		}
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
}
