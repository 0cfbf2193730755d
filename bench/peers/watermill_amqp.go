package main

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
)

// watermillAMQP is Watermill's router on its AMQP subscriber, configured as
// its documentation suggests for a durable queue, with the benchmark's
// prefetch, and the inbox SQL by hand in the handler: the router acks a
// message when its handler returns nil, after the commit.
func watermillAMQP(ctx context.Context, e *Env) error {
	cfg := wmamqp.NewDurableQueueConfig(e.AMQPURL)
	cfg.Queue.Arguments = queueArgs
	cfg.Consume.Qos.PrefetchCount = e.Prefetch
	log := watermill.NopLogger{}
	sub, err := wmamqp.NewSubscriber(cfg, log)
	if err != nil {
		return err
	}
	return runRouter(ctx, e, sub, log)
}

// runRouter runs a Watermill router with one handler on sub until ctx ends.
func runRouter(ctx context.Context, e *Env, sub message.Subscriber, log watermill.LoggerAdapter) error {
	router, err := message.NewRouter(message.RouterConfig{}, log)
	if err != nil {
		return err
	}
	router.AddConsumerHandler("peers", e.Source, sub, func(m *message.Message) error {
		if err := HandOne(m.Context(), e.Pool, e.Consumer, Msg{ID: m.UUID, Body: m.Payload}); err != nil {
			return err
		}
		e.Acked(1)
		return nil
	})
	go func() {
		<-ctx.Done()
		_ = router.Close()
	}()
	return router.Run(ctx)
}
