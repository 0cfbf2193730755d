package idemkafka

import (
	"context"
	"fmt"
	"strconv"

	"github.com/idemkit/idem"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Headers added to a dead letter, next to the original record's headers.
const (
	HeaderError             = "idem-error"
	HeaderOutcome           = "idem-outcome"
	HeaderConsumer          = "idem-consumer"
	HeaderAttempts          = "idem-attempts"
	HeaderOriginalTopic     = "idem-original-topic"
	HeaderOriginalPartition = "idem-original-partition"
	HeaderOriginalOffset    = "idem-original-offset"
)

// deadLetterRecord copies r for its dead-letter topic, keeping key, value,
// timestamp and headers (so the ID survives for a later replay) and adding
// why, who and where from.
func (c *Consumer[TTx]) deadLetterRecord(r *kgo.Record, res idem.Result, tries int) *kgo.Record {
	reason := "unknown"
	if res.Err != nil {
		reason = res.Err.Error()
	}
	h := make([]kgo.RecordHeader, 0, len(r.Headers)+7)
	h = append(h, r.Headers...)
	h = append(h,
		kgo.RecordHeader{Key: HeaderError, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderOutcome, Value: []byte(res.Outcome.String())},
		kgo.RecordHeader{Key: HeaderConsumer, Value: []byte(c.proc.Consumer())},
		kgo.RecordHeader{Key: HeaderAttempts, Value: []byte(strconv.Itoa(tries))},
		kgo.RecordHeader{Key: HeaderOriginalTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderOriginalPartition, Value: []byte(strconv.FormatInt(int64(r.Partition), 10))},
		kgo.RecordHeader{Key: HeaderOriginalOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	)
	return &kgo.Record{
		Topic:     c.cfg.DeadLetterTopic(r.Topic),
		Key:       r.Key,
		Value:     r.Value,
		Headers:   h,
		Timestamp: r.Timestamp,
	}
}

// deadLetter produces r to its dead-letter topic and waits for the broker.
// It keeps trying while ctx lives: moving the offset past a record that is
// in neither the database nor the dead-letter topic would lose it.
func (c *Consumer[TTx]) deadLetter(ctx context.Context, r *kgo.Record, res idem.Result, tries int) error {
	dl := c.deadLetterRecord(r, res, tries)
	for attempt := 1; ; attempt++ {
		err := c.dlq.ProduceSync(ctx, dl).FirstErr()
		if c.cfg.Hooks != nil {
			c.cfg.Hooks.OnDeadLetter(r, res, err)
		}
		if err == nil {
			c.cfg.Logger.Warn("record dead-lettered",
				"consumer", c.proc.Consumer(), "source", source(r.Topic, r.Partition), "offset", r.Offset,
				"message_id", res.MessageID, "dead_letter_topic", dl.Topic, "attempts", tries, "error", res.Err)
			return nil
		}
		c.cfg.Logger.Error("producing dead letter failed; the partition waits",
			"consumer", c.proc.Consumer(), "source", source(r.Topic, r.Partition), "offset", r.Offset, "error", err)
		if err := sleep(ctx, c.backoff.Backoff(attempt)); err != nil {
			return fmt.Errorf("producing dead letter to %s: %w", dl.Topic, err)
		}
	}
}
