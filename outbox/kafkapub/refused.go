package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/idemkit/idem/outbox"
)

// class is what an error of a produced record says about the record.
type class int

const (
	transient     class = iota // an outage: retried, never parked
	refusedRecord              // the record alone is at fault
	refusedBatch               // the broker refused the batch: the record, or one beside it, is at fault
	refusedTopic               // the topic is unknown: at fault if it does not exist
)

// classify sorts a produce error by the Kafka error code it carries, never
// by its text.
func classify(err error) class {
	switch {
	case errors.Is(err, kerr.MessageTooLarge),
		errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.InvalidTimestamp):
		return refusedBatch
	case errors.Is(err, kerr.InvalidTopicException):
		return refusedRecord
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return refusedTopic
	}
	return transient
}

// topicMissing asks the cluster whether topic exists. An answer other than
// "unknown topic" — the topic exists, or the cluster does not answer —
// is not taken for a missing topic.
func (p *Publisher) topicMissing(ctx context.Context, topic string) bool {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	details, err := kadm.NewClient(p.cl).ListTopics(ctx, topic)
	if err != nil {
		return false
	}
	d, ok := details[topic]
	return ok && errors.Is(d.Err, kerr.UnknownTopicOrPartition)
}

// recordSlack covers what the estimate in fits cannot know before the
// record is partitioned: the produce request version's batch header and
// varint widths. It errs on the side of refusing.
const recordSlack = 64

// batchHeader is the wire size of a record batch with no records.
const batchHeader = 61

// fits refuses, before anything is produced, a record franz-go would fail
// on its own for being too large: such a failure skips the record without
// failing its partition, so a later record of its key would go out ahead
// of it.
func (p *Publisher) fits(r *outbox.Record) error {
	// The record's own bytes as franz-go counts them for the buffer
	// limit, and an upper bound of its size alone in a v2 batch.
	user := int64(len(r.Key) + len(r.Body) + len(p.idHeader) + len(r.ID))
	wire := int64(batchHeader+recordSlack) + int64(len(r.Key)+len(r.Body)) + 3*5
	wire += int64(len(p.idHeader)+len(r.ID)) + 2*5
	if !r.EventTime.IsZero() {
		n := int64(len(p.timeHeader) + len(time.RFC3339Nano))
		user += n
		wire += n + 2*5
	}
	for k, v := range r.Headers {
		if k == p.idHeader || k == p.timeHeader {
			continue
		}
		user += int64(len(k) + len(v))
		wire += int64(len(k)+len(v)) + 2*5
	}
	if p.maxBytes > 0 && user > p.maxBytes {
		return fmt.Errorf("record %s is %d bytes, more than the client buffers (kgo.MaxBufferedBytes %d): %w", r.ID, user, p.maxBytes, kerr.MessageTooLarge)
	}
	if p.maxBatch != nil {
		if limit := int64(p.maxBatch(r.Destination)); wire > limit {
			return fmt.Errorf("record %s to topic %q takes up to %d bytes in a batch, more than the client's batch limit (kgo.ProducerBatchMaxBytes %d): %w", r.ID, r.Destination, wire, limit, kerr.MessageTooLarge)
		}
	}
	return nil
}
