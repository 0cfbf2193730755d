package idemkafka

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idem"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrBadTime is wrapped by the dead-letter reason of a record whose event-time
// header does not parse.
var ErrBadTime = errors.New("invalid event time header")

// source names a partition the way idem.Message.Source and the logs do.
func source(topic string, partition int32) string {
	return topic + "/" + strconv.FormatInt(int64(partition), 10)
}

// message turns a record into the processor's message. An error means the
// record is bad input: it goes to the dead-letter topic without touching the
// database.
func (c *Consumer[TTx]) message(r *kgo.Record, attempt int) (idem.Message, error) {
	m := idem.Message{
		Source:  source(r.Topic, r.Partition),
		Key:     string(r.Key),
		Body:    r.Value,
		Attempt: attempt,
		// Kafka says nothing about earlier deliveries; a retry in place is
		// the one redelivery this consumer knows of.
		Redelivered: attempt > 1,
	}
	if len(r.Headers) > 0 {
		m.Headers = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			m.Headers[h.Key] = string(h.Value)
		}
	}
	id, err := c.id(r)
	if err != nil {
		return m, err
	}
	if id == "" {
		return m, fmt.Errorf("%w: record has no %s header", idem.ErrNoMessageID, c.cfg.IDHeader)
	}
	m.ID = id
	switch {
	case c.cfg.TimeHeader != "":
		if v, ok := m.Headers[c.cfg.TimeHeader]; ok {
			if m.Time, err = parseTime(v); err != nil {
				return m, fmt.Errorf("%w %s: %w", ErrBadTime, c.cfg.TimeHeader, err)
			}
		}
	case c.cfg.RecordTimeStable:
		m.Time = r.Timestamp
	}
	return m, nil
}

func (c *Consumer[TTx]) id(r *kgo.Record) (id string, err error) {
	if c.cfg.ID == nil {
		for _, h := range r.Headers {
			if h.Key == c.cfg.IDHeader {
				id = string(h.Value)
			}
		}
		return id, nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: ID extractor panicked: %v", idem.ErrNoMessageID, p)
		}
	}()
	if id, err = c.cfg.ID(r); err != nil {
		return "", fmt.Errorf("%w: extracting ID: %w", idem.ErrNoMessageID, err)
	}
	return id, nil
}

func parseTime(v string) (time.Time, error) {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.UnixMilli(ms), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("parsing %q as RFC 3339 or Unix milliseconds: %w", v, err)
	}
	return t, nil
}
