package main

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/nats-io/nats.go/jetstream"
)

// watermillNATS is Watermill's router on its JetStream subscriber (the one
// on nats.go's jetstream package), with its defaults (each ack confirmed
// by the server: DoubleAck), on a durable like the others' with the
// benchmark's prefetch as MaxAckPending and pull size, and the inbox SQL
// by hand in the handler: the router acks a message when its handler
// returns nil, after the commit.
func watermillNATS(ctx context.Context, e *Env) error {
	url, err := natsURL(e.NATSURL)
	if err != nil {
		return err
	}
	log := watermill.NopLogger{}
	sub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{
		URL:    url,
		Logger: log,
		ResourceInitializer: func(ctx context.Context, js jetstream.JetStream, stream string) (jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
			cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "peers",
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: e.Prefetch})
			return cons, nil, err
		},
		ConsumeOptions: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(e.Prefetch)},
	})
	if err != nil {
		return err
	}
	return runRouter(ctx, e, sub, log)
}
