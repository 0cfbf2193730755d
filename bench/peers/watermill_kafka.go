package main

import (
	"context"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
)

// watermillKafka is Watermill's router on its Kafka subscriber (sarama) in
// e's consumer group, with Watermill's default sarama configuration but
// for the initial offset (the oldest: the workload is in the topic before
// the group first joins), and the inbox SQL by hand in the handler: the
// router acks a message when its handler returns nil, after the commit,
// and the subscriber marks its offset, which sarama commits every second
// (its default auto-commit).
func watermillKafka(ctx context.Context, e *Env) error {
	seeds, err := kafkaSeeds(e.Kafka)
	if err != nil {
		return err
	}
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	log := watermill.NopLogger{}
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers:               seeds,
		Unmarshaler:           wmkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         e.Consumer,
	}, log)
	if err != nil {
		return err
	}
	return runRouter(ctx, e, sub, log)
}
