package idemkafka

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// NewRecord returns a record for topic whose "idem-message-id" header carries
// id, the identity consumers deduplicate by. The ID must be assigned once by
// the producer and reused when the same event is published again.
func NewRecord(topic, id string, key, value []byte) *kgo.Record {
	return &kgo.Record{
		Topic:   topic,
		Key:     key,
		Value:   value,
		Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(id)}},
	}
}

// Publish produces value to topic with id in the "idem-message-id" header and
// waits until the broker acknowledged it. It is a helper for tests, demos and
// simple producers; high-volume producers build records with [NewRecord] and
// produce them asynchronously.
func Publish(ctx context.Context, cl *kgo.Client, topic, id string, key, value []byte) error {
	if err := cl.ProduceSync(ctx, NewRecord(topic, id, key, value)).FirstErr(); err != nil {
		return fmt.Errorf("publishing %s to %s: %w", id, topic, err)
	}
	return nil
}
