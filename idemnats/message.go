package idemnats

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
)

// Message converts a JetStream message into the processor's message.
// idHeader names the header carrying the identity (Nats-Msg-Id when
// empty) and timeHeader the event time (x-event-time when empty). The
// identity is never the stream sequence, which a republish changes; an
// absent identity stays empty, and the processor dead-letters the message
// rather than apply it unguarded.
//
// Source is the stream, Key the subject, Headers every header (the first
// value of each; W3C traceparent and tracestate among them, for tracing
// hooks). Time is the event time, from the most stable source the message
// has ([idem.EventTime]): the time inside a UUIDv7 ID, then the event-time
// header, then the time the stream stored the message. Attempt is
// JetStream's delivery count; Redelivered is set from the second delivery.
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
	out.Time, out.TimeSource = idem.EventTime(out.ID, headerTime(h.Get(timeHeader)), stored)
	return out
}

// headerTime reads an event-time header value; zero when it is absent or
// unreadable.
func headerTime(v string) time.Time {
	if v == "" {
		return time.Time{}
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 {
		return time.UnixMilli(ms)
	}
	return time.Time{}
}
