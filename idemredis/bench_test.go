package idemredis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// BenchmarkConsume applies b.N entries into PostgreSQL, in batches of 100,
// in one run: "plain" is XREADGROUP, the effects inserted in one
// transaction per batch with no guard, and XACK (what a consumer without
// idem does, and doubles on every redelivery); "idem" is the Consumer over
// pgxinbox, the claim in the same transaction. Compare their msgs/s.
//
//	go test -run '^$' -bench Consume -benchtime 20000x ./idemredis/
func BenchmarkConsume(b *testing.B) {
	rdb := redistest.Client(b)
	b.Run("plain", func(b *testing.B) {
		stream, pool := benchSetup(b, rdb)
		ctx := context.Background()
		b.ResetTimer()
		for done := 0; done < b.N; {
			res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "plain", Streams: []string{stream, ">"}, Count: 100, Block: time.Second}).Result()
			if err != nil {
				b.Fatal(err)
			}
			msgs := res[0].Messages
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				for _, m := range msgs {
					if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, m.Values[idemredis.DefaultIDField]); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.ID
			}
			if err := rdb.XAck(ctx, stream, "g", ids...).Err(); err != nil {
				b.Fatal(err)
			}
			done += len(msgs)
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("idem", func(b *testing.B) {
		stream, pool := benchSetup(b, rdb)
		_, store := inboxOn(b, pool)
		c, err := idemredis.New(rdb, processor(b, store), &idemredis.Config{Stream: stream, Group: "g", BatchSize: 100, Logger: quiet(b)})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		stop := run(b, c)
		deadline := time.Now().Add(10 * time.Minute)
		for c.Stats().Applied < uint64(b.N) {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d applied after 10 minutes", c.Stats().Applied, b.N)
			}
			time.Sleep(5 * time.Millisecond)
		}
		b.StopTimer()
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}

// benchSetup publishes b.N entries to a stream of its own with a group,
// and returns it with a pool on a schema that has the effects table.
func benchSetup(b *testing.B, rdb *redis.Client) (string, *pgxpool.Pool) {
	b.Helper()
	stream := redistest.Prefix(b, rdb) + "bench"
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		b.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, rdb, stream+".dlq"); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i += 1000 {
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j := i; j < min(i+1000, b.N); j++ {
				p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
					idemredis.DefaultIDField, fmt.Sprintf("m-%08d", j), idemredis.DefaultBodyField, "{}",
				}})
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	pool, _ := inbox(b, pgtest.Schema(b))
	return stream, pool
}
