package idemkafka

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrBadTime is wrapped by the dead-letter reason of a record whose event-time
// header does not parse (and whose ID carries no time).
//
// Deprecated: it is idem.ErrBadTime, which the processor decides the same
// on every broker.
var ErrBadTime = idem.ErrBadTime

// source names a partition the way idem.Message.Source and the logs do.
func source(topic string, partition int32) string {
	return topic + "/" + strconv.FormatInt(int64(partition), 10)
}

// message turns a record into the processor's message. A record whose
// event-time header does not parse is handed over with Message.TimeErr set,
// and one without an ID, or whose ID extractor failed, with an empty ID: the
// processor dead-letters both as bad input and logs and counts them like any
// other outcome; noID is then the reason its dead letter gives.
func (c *Consumer[TTx]) message(r *kgo.Record, attempt int) (m idem.Message, noID error) {
	m = idem.Message{
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
	if c.cfg.Positions != PositionsOff {
		m.Next = r.Offset + 1
	}
	m.ID, noID = c.id(r)
	if noID == nil && m.ID == "" {
		noID = fmt.Errorf("%w: record has no %s header", idem.ErrNoMessageID, c.cfg.IDHeader)
	}
	if noID != nil {
		m.ID = "" // the processor dead-letters it; its time does not matter
		return m, noID
	}
	// The time inside a UUIDv7 ID wins; a bad header matters only when
	// the ID carries none.
	var header time.Time
	if v, ok := m.Headers[c.cfg.TimeHeader]; ok {
		if _, fromID := idem.TimeFromUUIDv7(m.ID); !fromID {
			var err error
			if header, err = idembroker.ParseEventTime(v); err != nil {
				m.TimeErr = fmt.Errorf("header %s: %w", c.cfg.TimeHeader, err)
			}
		}
	}
	m.Time, m.TimeSource = idem.EventTime(m.ID, header, r.Timestamp)
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
