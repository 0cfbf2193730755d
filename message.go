package idem

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxKeyLen is the longest inbox key, in bytes, that a processor accepts.
// Longer keys are dead-lettered as bad input rather than truncated, because
// two truncated keys could collide and hide a real effect.
const MaxKeyLen = 512

// Message is one delivery of a broker message, as the adapters hand it to a
// [Processor]. Only ID is required; the rest is context for keys and handlers.
type Message struct {
	// ID is the producer-assigned identity of the message, stable across
	// redeliveries (AMQP message_id, a Kafka header). Never a broker offset or
	// delivery tag. A message without an ID is dead-lettered, never applied.
	ID string
	// Source names where the message came from: a queue, or topic/partition.
	Source string
	// Key is the broker's routing or record key. It is NOT the inbox key: that
	// is what the consumer's [KeyFunc] returns.
	Key string
	// Headers are the message headers, as strings.
	Headers map[string]string
	// Body is the payload.
	Body []byte
	// Time is the message's event time, when known (zero otherwise), from
	// the most stable source there is; see [EventTime].
	Time time.Time
	// TimeSource says where Time came from.
	TimeSource TimeSource
	// Redelivered is the broker's hint that this delivery was seen before. It is
	// informative only and never replaces the inbox.
	Redelivered bool
	// Attempt counts deliveries of this message as the broker reports them,
	// starting at 1 (0 when the broker does not say).
	Attempt int
	// TimeErr is set by an adapter when the message carries an event-time
	// header it cannot read and its ID carries no time: the processor
	// dead-letters the message as bad input, with an error wrapping
	// [ErrBadTime] and TimeErr, the same on every broker.
	TimeErr error
	// Next is the position in Source just past this message (a Kafka
	// record's offset plus one), set by an adapter of a log broker that
	// records positions (docs/design.md 17); 0 records none. Process and
	// ProcessBatchInOrder record, in the transaction that settles a
	// message, the highest Next of each Source in it (idemstore.Position);
	// ProcessBatch, whose messages may settle out of order, and ProcessTx
	// record none.
	Next int64
}

// TimeSource is where a message's event time came from, most stable first.
type TimeSource int8

const (
	// TimeNone: the message carries no usable time. Its marker is kept a
	// window after it was written, and a replay after that cannot be told
	// from a new message (see Config.Untimed).
	TimeNone TimeSource = iota
	// TimeFromID: the time inside a UUIDv7 message ID. The same on every
	// redelivery, republish and replay of the message.
	TimeFromID
	// TimeFromHeader: a producer's event-time header. The same on
	// redelivery and replay; a producer that republishes may stamp a new one.
	TimeFromHeader
	// TimeFromBroker: the broker's timestamp (AMQP timestamp property, Kafka
	// record timestamp). A republish gets a fresh one.
	TimeFromBroker
)

var timeSourceNames = [...]string{"none", "id", "header", "broker"}

// String returns the lower-case name used in logs and metric labels.
func (s TimeSource) String() string {
	if s < 0 || int(s) >= len(timeSourceNames) {
		return "unknown"
	}
	return timeSourceNames[s]
}

// EventTime picks a message's event time from the most stable source it
// has: the time inside a UUIDv7 ID, then a producer's event-time header,
// then the broker's timestamp. Zero times are absent. Adapters fill
// Message.Time and Message.TimeSource with it.
func EventTime(id string, header, broker time.Time) (time.Time, TimeSource) {
	if t, ok := TimeFromUUIDv7(id); ok {
		return t, TimeFromID
	}
	if !header.IsZero() {
		return header, TimeFromHeader
	}
	if !broker.IsZero() {
		return broker, TimeFromBroker
	}
	return time.Time{}, TimeNone
}

// KeyFunc returns the inbox key of the effect a message causes. Two messages
// with the same key cause the effect once. Every consumer declares one; there
// is no default.
type KeyFunc func(Message) (string, error)

// ByMessageID keys the effect by the message ID: each distinct message is
// applied once. It is the usual choice when no business key exists.
func ByMessageID(m Message) (string, error) { return m.ID, nil }

// JSONKey decodes the body as JSON into T and keys the effect by what f
// returns, for business keys such as "invoice:<customer>:<period>" that dedupe
// two different messages asking for the same effect. A body that does not
// decode is bad input and is dead-lettered.
func JSONKey[T any](f func(T) string) KeyFunc {
	return func(m Message) (string, error) {
		var v T
		if err := json.Unmarshal(m.Body, &v); err != nil {
			return "", fmt.Errorf("decoding body for key: %w", err)
		}
		return f(v), nil
	}
}

// Errors that classify bad input. A result's Err wraps one of them, so
// callers can test with errors.Is.
var (
	ErrNoMessageID = errors.New("message has no ID")
	// ErrBadTime: the message's event-time header cannot be read
	// (Message.TimeErr).
	ErrBadTime = errors.New("invalid event time header")
	ErrBadKey  = errors.New("invalid inbox key")
	// ErrUntimed: the message carries no event time and the consumer
	// refuses such messages (Config.RefuseUntimed).
	ErrUntimed = errors.New("message has no event time")
	// ErrNoPartitionTime: a partitioned inbox cannot place the message's
	// key: the key is not a UUIDv7, or Config.PartitionTime refused it.
	ErrNoPartitionTime = errors.New("no partition time can be derived from the key (the partitioned inbox needs one: a UUIDv7 message ID, or Config.PartitionTime)")
)

// partitionTimeFromUUIDv7 is the default partition time of a consumer
// keyed by message ID: the time inside a UUIDv7 key.
func partitionTimeFromUUIDv7(key string) (time.Time, error) {
	t, ok := TimeFromUUIDv7(key)
	if !ok {
		return time.Time{}, errors.New("not a UUIDv7 (the default rule for a consumer keyed by message ID)")
	}
	return t, nil
}

// sameFunc reports whether two key funcs are the same top-level function.
func sameFunc(a, b KeyFunc) bool {
	return a != nil && b != nil && reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer()
}

// validKey reports why key cannot be stored as an inbox key, or nil.
func validKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrBadKey)
	case strings.TrimSpace(key) == "":
		// Two messages whose key func returned " " would collapse into
		// one effect.
		return fmt.Errorf("%w: blank (only white space)", ErrBadKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrBadKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrBadKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: contains a NUL byte", ErrBadKey)
	}
	return nil
}

// validID reports why a message ID is unusable, or nil. The ID is stored next
// to the marker, so it obeys the same limits as a key.
func validID(id string) error {
	if id == "" {
		return ErrNoMessageID
	}
	if err := validKey(id); err != nil {
		return fmt.Errorf("message ID: %w", err)
	}
	return nil
}

// BodyHash is the SHA-256 of a message body, recorded with each marker so
// that a later message with the same key but another body can be noticed.
func BodyHash(body []byte) []byte {
	h := sha256.Sum256(body)
	return h[:]
}
