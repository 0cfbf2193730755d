package outbox

import (
	"context"
	"errors"
	"time"
)

// Record is one committed outbox row handed to a Publisher.
type Record struct {
	Seq         int64             // commit-ordered sequence within the outbox table
	ID          string            // UUIDv7 assigned at Enqueue; the downstream idem consumer's message ID
	Destination string            // Kafka topic, or RabbitMQ exchange ("" = the default exchange)
	RoutingKey  string            // RabbitMQ routing key (the queue, with the default exchange); ignored by Kafka
	Key         string            // ordering key: same key → published in commit order; the Kafka record key
	Headers     map[string]string // the caller's headers; publishers add the ID and event-time headers
	Body        []byte
	EventTime   time.Time // the time inside ID
	Attempts    int       // publish attempts before this one
}

// Publisher sends records to a broker and reports, per record, whether the
// broker confirmed it durable (nil), refused the record itself (an error
// for which IsRefused is true: unroutable, too large, unknown topic — the
// relay parks it after bounded attempts), or could not be reached (any
// other error: an outage, retried with backoff, nothing parked). recs holds
// records of several keys; records of one key are in commit order and must
// be published in that order: after a failure of a key, a publisher must
// not publish that key's later records in this call (return ErrNotAttempted
// for them). Publish must return only once every record's fate is known or
// ctx is done. Publishers are used by one relay goroutine at a time.
type Publisher interface {
	Publish(ctx context.Context, recs []Record) []error
	Close() error
}

// ErrNotAttempted is returned for a record not sent because an earlier
// record of its key failed in the same call.
var ErrNotAttempted = errors.New("outbox: not attempted: an earlier record of its key failed")

// refusedError marks an error as the broker refusing the record itself.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// Refused marks err as the broker refusing the record itself. Refused(nil)
// is nil.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return &refusedError{err: err}
}

// IsRefused reports whether err was marked with Refused.
func IsRefused(err error) bool {
	var r *refusedError
	return errors.As(err, &r)
}
