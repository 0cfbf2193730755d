package idemredis

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// ErrBadTime is wrapped by the dead-letter reason of an entry whose
// event-time field does not parse (and whose ID carries no time).
//
// Deprecated: it is idem.ErrBadTime, which the processor decides the same
// on every broker.
var ErrBadTime = idem.ErrBadTime

// Entry is one stream entry as the consumer holds it.
type Entry struct {
	// Stream and ID say where it is: the entry ID is a delivery's
	// address, never the message's identity.
	Stream, ID string
	// Fields are its fields, in a map (a field given twice keeps its last
	// value).
	Fields map[string]string
	// Deliveries is the group's delivery counter of the entry when it was
	// read (1 for a first delivery).
	Deliveries int64
}

func entryOf(stream string, m redis.XMessage, deliveries int64) Entry {
	e := Entry{Stream: stream, ID: m.ID, Fields: make(map[string]string, len(m.Values)), Deliveries: deliveries}
	for k, v := range m.Values {
		switch v := v.(type) {
		case string:
			e.Fields[k] = v
		default:
			e.Fields[k] = fmt.Sprint(v)
		}
	}
	return e
}

// origin names an entry the way [FieldOrigin] does.
func (e Entry) origin() string { return e.Stream + "/" + e.ID }

// entryTime is the time in an entry ID's first part.
func entryTime(id string) time.Time {
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		return time.Time{}
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n)
}

// message turns an entry into the processor's message; runs counts the
// earlier runs of the entry by this consumer. An entry whose event-time
// field does not parse (and whose ID carries no time) is handed over with
// Message.TimeErr set, and one without an ID with an empty ID: the
// processor dead-letters both as bad input (idem.ErrBadTime,
// idem.ErrNoMessageID); noID is then the reason its dead letter gives.
func (c *Config) message(e Entry, runs int) (m idem.Message, noID error) {
	attempt := int(max(e.Deliveries, 1)) + runs
	m = idem.Message{
		Source:      e.Stream,
		Key:         e.Fields[c.KeyField],
		Body:        []byte(e.Fields[c.BodyField]),
		Attempt:     attempt,
		Redelivered: attempt > 1,
		ID:          e.Fields[c.IDField],
	}
	for k, v := range e.Fields {
		if k == c.BodyField {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(e.Fields))
		}
		m.Headers[k] = v
	}
	if m.ID == "" {
		noID = fmt.Errorf("%w: entry %s has no %s field", idem.ErrNoMessageID, e.origin(), c.IDField)
	}
	var field time.Time
	if v, ok := e.Fields[c.TimeField]; ok {
		t, err := idembroker.ParseEventTime(v)
		if _, fromID := idem.TimeFromUUIDv7(m.ID); err != nil && !fromID {
			// The time inside a UUIDv7 ID wins; a bad field matters only
			// when the ID carries none.
			m.TimeErr = fmt.Errorf("field %s: %w", c.TimeField, err)
		}
		field = t
	}
	m.Time, m.TimeSource = idem.EventTime(m.ID, field, entryTime(e.ID))
	return m, noID
}
