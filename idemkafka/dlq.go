package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrDeadLetterTopic is wrapped by Run's error when a dead-letter topic is
// missing and may not be created, or cannot be checked.
var ErrDeadLetterTopic = errors.New("dead-letter topic not usable")

// origin names a record the way [idembroker.HeaderOrigin] does.
func origin(r *kgo.Record) string {
	return source(r.Topic, r.Partition) + "/" + strconv.FormatInt(r.Offset, 10)
}

// deadLetterRecord copies r for its dead-letter topic, keeping key, value,
// timestamp and headers (so the ID survives for a later replay) and adding
// why, who, how often and where from.
func (c *Consumer[TTx]) deadLetterRecord(r *kgo.Record, res idem.Result) *kgo.Record {
	h := make([]kgo.RecordHeader, 0, len(r.Headers)+len(idembroker.EnvelopeHeaders))
	h = append(h, r.Headers...)
	idembroker.NewEnvelope(c.proc.Consumer(), origin(r), res, res.Disposition).Write(
		func(k, v string) { h = append(h, kgo.RecordHeader{Key: k, Value: []byte(v)}) },
		func(k string, n int64) { h = append(h, kgo.RecordHeader{Key: k, Value: strconv.AppendInt(nil, n, 10)}) })
	return &kgo.Record{
		Topic:     c.cfg.DeadLetterTopic(r.Topic),
		Key:       r.Key,
		Value:     r.Value,
		Headers:   h,
		Timestamp: r.Timestamp,
	}
}

// deadLetter produces r to its dead-letter topic and waits until all
// in-sync replicas have it (NewConsumer refuses a producer with fewer
// acks). It keeps trying while ctx lives: moving the offset past a record
// that is in neither the database nor the dead-letter topic would lose it.
// The processor logged the outcome already; a failure is logged here.
func (c *Consumer[TTx]) deadLetter(ctx context.Context, r *kgo.Record, res idem.Result) error {
	dl := c.deadLetterRecord(r, res)
	for attempt := 1; ; attempt++ {
		err := c.dlTopics.ensure(ctx, r.Topic)
		if err == nil {
			err = c.dlq.ProduceSync(ctx, dl).FirstErr()
		}
		c.kit.DeadLetter(dl.Topic, res, err)
		if err == nil {
			c.cfg.Logger.Debug("dead letter produced", "consumer", c.proc.Consumer(), "origin", origin(r),
				"message_id", res.MessageID, "dead_letter_topic", dl.Topic)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("producing dead letter to %s: %w", dl.Topic, ctx.Err())
		}
		if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
			// Deleted since it was checked, perhaps created again: check
			// (or create) it again, and make the producer forget the
			// deleted topic's identity (franz-go fails a recreated topic
			// with UNKNOWN_TOPIC_ID until it is purged).
			c.dlTopics.forget(dl.Topic)
			c.dlq.PurgeTopicsFromProducing(dl.Topic)
		}
		c.cfg.Logger.Error("producing dead letter failed; the partition waits",
			"consumer", c.proc.Consumer(), "origin", origin(r), "dead_letter_topic", dl.Topic, "error", err)
		if err := sleep(ctx, c.backoff.Delay(attempt)); err != nil {
			return fmt.Errorf("producing dead letter to %s: %w", dl.Topic, err)
		}
	}
}

// deadLetterTopics makes sure each dead-letter topic exists before a dead
// letter is produced to it: Run checks those of the consumed topics at
// start, and a topic first met later (a regex subscription) is checked
// before its first dead letter. A topic found once is not asked about
// again.
type deadLetterTopics struct {
	cl     *kgo.Client
	name   func(topic string) string
	create bool
	mu     sync.Mutex
	known  map[string]bool // dead-letter topics known to exist
}

// ensure makes sure the dead-letter topic of topic exists, creating it when
// allowed with the partition count and replication factor of topic.
func (d *deadLetterTopics) ensure(ctx context.Context, topic string) error {
	dlt := d.name(topic)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.known[dlt] {
		return nil
	}
	adm := kadm.NewClient(d.cl)
	details, err := adm.ListTopics(ctx, dlt, topic)
	if err != nil {
		return fmt.Errorf("%w: checking %s: %w", ErrDeadLetterTopic, dlt, err)
	}
	dl := details[dlt]
	switch {
	case dl.Err == nil:
		d.known[dlt] = true
		return nil
	case !errors.Is(dl.Err, kerr.UnknownTopicOrPartition):
		return fmt.Errorf("%w: checking %s: %w", ErrDeadLetterTopic, dlt, dl.Err)
	case !d.create:
		return fmt.Errorf("%w: %s, the dead-letter topic of %s, does not exist: create it (with the replication of %s), or set idemkafka.Config.CreateDeadLetterTopics",
			ErrDeadLetterTopic, dlt, topic, topic)
	}
	src := details[topic]
	if src.Err != nil {
		return fmt.Errorf("%w: creating %s: reading %s: %w", ErrDeadLetterTopic, dlt, topic, src.Err)
	}
	replicas := int16(-1) // the broker's default
	if p, ok := src.Partitions[0]; ok && len(p.Replicas) > 0 {
		replicas = int16(len(p.Replicas))
	}
	resp, err := adm.CreateTopic(ctx, int32(len(src.Partitions)), replicas, nil, dlt)
	if err == nil && !errors.Is(resp.Err, kerr.TopicAlreadyExists) {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("%w: creating %s: %w", ErrDeadLetterTopic, dlt, err)
	}
	d.known[dlt] = true
	return nil
}

// forget makes ensure ask about dlt again.
func (d *deadLetterTopics) forget(dlt string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.known, dlt)
}
