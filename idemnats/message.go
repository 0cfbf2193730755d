package idemnats

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// Message converts a JetStream message into the processor's message.
// idHeader names the header carrying the identity (Nats-Msg-Id when
// empty) and timeHeader the event time (idembroker.HeaderEventTime when
// empty). The identity is never the stream sequence, which a republish
// changes; an absent identity stays empty, and the processor dead-letters
// the message rather than apply it unguarded.
//
// Source is the stream, Key the subject, Headers every header (the first
// value of each; W3C traceparent and tracestate among them, for tracing
// hooks). Time is the event time, from the most stable source the message
// has ([idem.EventTime]): the time inside a UUIDv7 ID, then the event-time
// header (read with [idembroker.ParseEventTime]), then the time the stream
// stored the message. A header that is not a time, on a message whose ID
// carries none, sets TimeErr: the processor dead-letters the message as
// bad input (idem.ErrBadTime), as on every broker. Attempt is JetStream's
// delivery count; Redelivered is set from the second delivery.
func Message(m jetstream.Msg, stream, idHeader, timeHeader string) idem.Message {
	if idHeader == "" {
		idHeader = DefaultIDHeader
	}
	if timeHeader == "" {
		timeHeader = DefaultTimeHeader
	}
	h := m.Headers()
	out := idem.Message{
		ID:     h.Get(idHeader),
		Source: stream,
		Key:    m.Subject(),
		Body:   m.Data(),
	}
	if len(h) > 0 {
		out.Headers = make(map[string]string, len(h))
		for k, v := range h {
			if len(v) > 0 {
				out.Headers[k] = v[0]
			}
		}
	}
	var stored time.Time
	if md, err := m.Metadata(); err == nil {
		stored = md.Timestamp
		out.Attempt = int(md.NumDelivered)
		out.Redelivered = md.NumDelivered > 1
	}
	header, err := headerTime(h.Get(timeHeader))
	if _, fromID := idem.TimeFromUUIDv7(out.ID); err != nil && !fromID {
		// The time inside a UUIDv7 ID wins; a bad header matters only
		// when the ID carries none.
		out.TimeErr = fmt.Errorf("header %s: %w", timeHeader, err)
	}
	out.Time, out.TimeSource = idem.EventTime(out.ID, header, stored)
	return out
}

// headerTime reads an event-time header value: zero when it is absent, an
// error when it is there and is not a time after 1970.
func headerTime(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := idembroker.ParseEventTime(v)
	if err == nil && t.UnixMilli() <= 0 {
		err = fmt.Errorf("%q is not after 1970", v)
	}
	if err != nil {
		return time.Time{}, err
	}
	return t, nil
}
