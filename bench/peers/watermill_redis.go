package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem/idemredis"
)

// watermillRedis is Watermill's router on its Redis Streams subscriber,
// in the benchmark's consumer group with its defaults, reading the
// entries' ID and body fields, and the inbox SQL by hand in the handler:
// the router acks (XACK) an entry when its handler returns nil, after the
// commit.
func watermillRedis(ctx context.Context, e *Env) error {
	rdb := redisClient(e.RedisAddr)
	defer rdb.Close()
	log := watermill.NopLogger{}
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        rdb,
		Consumer:      "peers",
		ConsumerGroup: redisGroup,
		OldestId:      "0",
		Unmarshaller:  redisUnmarshaller{},
	}, log)
	if err != nil {
		return err
	}
	return runRouter(ctx, e, sub, log)
}

// redisUnmarshaller reads the fields the benchmark's producer writes
// (idemredis's): Watermill's own marshaller names them otherwise.
type redisUnmarshaller struct{}

func (redisUnmarshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	id, _ := values[idemredis.DefaultIDField].(string)
	body, _ := values[idemredis.DefaultBodyField].(string)
	if id == "" {
		return nil, fmt.Errorf("entry without %s", idemredis.DefaultIDField)
	}
	return message.NewMessage(id, []byte(body)), nil
}
