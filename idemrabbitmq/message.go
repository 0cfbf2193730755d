package idemrabbitmq

import (
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// deliveryCountHeader is set by quorum queues on redelivery: how many times
// the message was delivered and returned before.
const deliveryCountHeader = "x-delivery-count"

// Message converts a delivery from queue into the processor's message.
// idHeader names the header carrying the identity; empty means the AMQP
// message_id property. The identity is never taken from the delivery tag or
// the redelivered flag, which change between deliveries of one message; an
// absent identity stays empty, and the processor dead-letters the message
// rather than apply it unguarded.
//
// Time is the event time, from the most stable source the message has
// ([idem.EventTime]): the time inside a UUIDv7 ID, then the
// [idembroker.HeaderEventTime] header, then the AMQP timestamp property;
// TimeSource says which. A header that is not a time (RFC 3339 or Unix
// milliseconds, as text or an integer, or an AMQP timestamp), on a message
// whose ID carries no time, sets TimeErr: the processor dead-letters the
// message as bad input (idem.ErrBadTime), as it does on Kafka.
//
// Attempt is x-delivery-count + 1 when the broker sets that header (quorum
// queues), 1 for a first delivery (redelivered=false), and 0 (unknown)
// otherwise. Retry counters a publisher puts in headers are not read.
func Message(d *amqp.Delivery, queue, idHeader string) idem.Message {
	m := idem.Message{
		ID:          d.MessageId,
		Source:      queue,
		Key:         d.RoutingKey,
		Body:        d.Body,
		Redelivered: d.Redelivered,
	}
	if idHeader != "" {
		m.ID = ""
		if v, ok := d.Headers[idHeader]; ok && v != nil {
			m.ID = headerString(v)
		}
	}
	if len(d.Headers) > 0 {
		m.Headers = make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			m.Headers[k] = headerString(v)
		}
	}
	header, err := headerTime(d.Headers[idembroker.HeaderEventTime])
	if _, fromID := idem.TimeFromUUIDv7(m.ID); err != nil && !fromID {
		// The time inside a UUIDv7 ID wins; a bad header matters only
		// when the ID carries none.
		m.TimeErr = fmt.Errorf("header %s: %w", idembroker.HeaderEventTime, err)
	}
	m.Time, m.TimeSource = idem.EventTime(m.ID, header, d.Timestamp)
	if n, ok := deliveryCount(d.Headers[deliveryCountHeader]); ok {
		m.Attempt = n + 1
	} else if !d.Redelivered {
		m.Attempt = 1
	}
	return m
}

// headerTime reads an event-time header value: zero when it is absent, an
// error when it is there and is not a time (idembroker.ParseEventTime for
// text, a positive integer of Unix milliseconds, an AMQP timestamp).
func headerTime(v any) (time.Time, error) {
	switch x := v.(type) {
	case nil:
		return time.Time{}, nil
	case time.Time:
		return x, nil
	case string:
		t, err := idembroker.ParseEventTime(x)
		if err == nil && t.UnixMilli() <= 0 {
			err = fmt.Errorf("%q is not after 1970", x)
		}
		if err != nil {
			return time.Time{}, err
		}
		return t, nil
	case []byte:
		return headerTime(string(x))
	default:
		if ms, ok := deliveryCount(v); ok && ms > 0 {
			return time.UnixMilli(int64(ms)), nil
		}
	}
	return time.Time{}, fmt.Errorf("%v (%T) is not a time", v, v)
}

func deliveryCount(v any) (int, bool) {
	switch n := v.(type) {
	case int64:
		return int(n), n >= 0
	case int32:
		return int(n), n >= 0
	case int16:
		return int(n), n >= 0
	case int8:
		return int(n), n >= 0
	case int:
		return n, n >= 0
	case uint8:
		return int(n), true
	case uint16:
		return int(n), true
	case uint32:
		return int(n), true
	}
	return 0, false
}

// headerString renders an AMQP table value as the string handlers see.
func headerString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case []byte:
		return string(x)
	case bool:
		return strconv.FormatBool(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case int32:
		return strconv.FormatInt(int64(x), 10)
	case int16:
		return strconv.FormatInt(int64(x), 10)
	case int8:
		return strconv.FormatInt(int64(x), 10)
	case int:
		return strconv.Itoa(x)
	case uint8:
		return strconv.FormatUint(uint64(x), 10)
	case uint16:
		return strconv.FormatUint(uint64(x), 10)
	case uint32:
		return strconv.FormatUint(uint64(x), 10)
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	}
	return fmt.Sprint(v)
}
