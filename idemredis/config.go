package idemredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/logfmt"
)

// ErrConfig is wrapped by every configuration error of [New].
var ErrConfig = errors.New("invalid idemredis configuration")

// Config configures a [Consumer]. Stream and Group are required; the rest
// has defaults.
type Config struct {
	// Stream is the stream consumed.
	Stream string
	// Group is the consumer group: consumers of one group share the
	// stream's entries and take over each other's pending entries.
	Group string
	// GroupStart, when set, lets Run create the group when it is missing,
	// at this entry ID ("0": the whole stream; "$": only new entries),
	// creating the stream too. Empty: Run refuses to start without the
	// group, naming the command that creates it.
	GroupStart string
	// Name is this consumer's name in the group. Defaults to the host name,
	// the process ID and a random suffix. A consumer that restarts under its
	// own name resumes its pending entries at once; under a new one they
	// are taken over after ClaimIdle.
	Name string

	// IDField names the field holding the message ID. Defaults to
	// "idem-message-id". An entry without it is dead-lettered. The entry ID
	// is never the message's identity: a republish gets a new one.
	IDField string
	// TimeField names the field holding the producer's event time.
	// Defaults to "x-event-time". The event time comes from the time inside
	// a UUIDv7 ID, then this field, then the entry ID's milliseconds; a
	// field that does not parse, on an entry whose ID carries no time,
	// dead-letters the entry.
	TimeField string
	// BodyField names the payload's field. Defaults to "body". The other
	// fields (the trace context among them) are idem.Message.Headers.
	BodyField string
	// KeyField names the routing key's field (idem.Message.Key). Defaults
	// to "key".
	KeyField string

	// DeadLetterStream names the dead-letter stream. Defaults to Stream +
	// ".dlq". Run checks at start that it exists, and refuses to start
	// otherwise unless CreateDeadLetterStream is set; a dead letter is
	// copied there and the original acked in one Lua script, which is
	// refused while the stream is missing (the original then stays
	// pending). On a Redis Cluster both names must hash to one slot: give
	// them a hash tag ("{orders}", "{orders}.dlq").
	DeadLetterStream string
	// CreateDeadLetterStream lets Run create a missing dead-letter stream.
	CreateDeadLetterStream bool

	// MaxAge is the stream's retention as its producers keep it: entries
	// older than this are trimmed (XADD ... MINID ~ <now - MaxAge>, or
	// XTRIM MINID on a schedule). Redis has no time retention of its own
	// and a MAXLEN bound says nothing about age, so 0 means the stream
	// keeps its entries forever. Run refuses to start when MaxAge, or the
	// age of the stream's oldest entry, is longer than the inbox window
	// (idem.Processor.Window): a replay (XGROUP SETID, a group restored
	// from a backup) would then deliver entries whose markers may be
	// pruned. See AcceptReplayPastWindow.
	MaxAge time.Duration
	// AcceptReplayPastWindow lets Run start in front of a stream that
	// holds, or may hold, entries older than the inbox window: the
	// operator takes it that the group is never moved back past the
	// window (a message older than the window is then judged by the
	// processor's horizon guard, not by its marker).
	AcceptReplayPastWindow bool

	// BatchSize bounds the entries read at once (XREADGROUP COUNT) and
	// processed in one transaction. Defaults to 100.
	BatchSize int
	// Block is how long one XREADGROUP waits for new entries. Defaults to
	// 1s; a shutdown waits for it.
	Block time.Duration
	// ClaimIdle is how long an entry stays pending with a consumer before
	// another takes it over (XAUTOCLAIM min-idle): a consumer that died
	// leaves its entries that long. A running consumer keeps the entries
	// it holds from going idle, however long their transaction or their
	// retry takes. Defaults to 1 minute.
	ClaimIdle time.Duration
	// ClaimEvery is how often the consumer looks for idle entries to take
	// over. Defaults to ClaimIdle / 2.
	ClaimEvery time.Duration
	// AckTimeout bounds the final XACK at shutdown. Defaults to 5s.
	AckTimeout time.Duration

	// Backoff paces the tries of a failing Redis call; Backoff.Initial is
	// also the pause before an entry is run again when the processor's
	// disposition names no delay. How often an entry is retried is the
	// processor's decision (idem.RetryPolicy). Defaults to 100ms..5s.
	Backoff idem.Backoff

	// Hooks are hooks of this consumer alone, called after the
	// processor's: idembroker.SettleHook, idembroker.DeadLetterHook, and this
	// package's [AckHook] and [ClaimHook].
	Hooks []idem.Hook
	// Faults injects crashes between the database commit and the XACK,
	// for tests and drills. Optional.
	Faults FaultFunc
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// BeforeAck is the fault point where the entries committed in the
// database and are not yet acked. A crash here leaves them pending;
// whoever takes them over finds their markers.
const BeforeAck idem.FaultPoint = "before_ack"

// FaultFunc is called at every fault point with the entry IDs about to be
// acked. A non-nil error crashes the consumer there: nothing more is sent
// to Redis, and Run returns an error wrapping [ErrCrashed].
type FaultFunc func(ctx context.Context, point idem.FaultPoint, stream string, ids []string) error

// ErrCrashed is wrapped by Run's error after a fault.
var ErrCrashed = errors.New("idemredis consumer crashed")

func (c *Config) setDefaults() {
	if c.Name == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.IDField, DefaultIDField)
	def(&c.TimeField, DefaultTimeField)
	def(&c.BodyField, DefaultBodyField)
	def(&c.KeyField, DefaultKeyField)
	def(&c.DeadLetterStream, c.Stream+".dlq")
	dur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	dur(&c.Block, time.Second)
	dur(&c.ClaimIdle, time.Minute)
	dur(&c.ClaimEvery, c.ClaimIdle/2)
	dur(&c.AckTimeout, 5*time.Second)
	c.Backoff = c.Backoff.WithDefaults(idem.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second})
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = logfmt.Wrap(c.Logger)
}

func (c *Config) validate() error {
	var errs []error
	if c.Stream == "" || c.Group == "" {
		errs = append(errs, errors.New("stream and group are required"))
	}
	if c.DeadLetterStream == c.Stream {
		errs = append(errs, fmt.Errorf("the dead-letter stream is the stream consumed (%s)", c.Stream))
	}
	if c.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("max age %v must not be negative", c.MaxAge))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("batch size %d must be positive", c.BatchSize))
	}
	if c.Block <= 0 || c.ClaimIdle < 10*time.Millisecond || c.ClaimEvery <= 0 || c.AckTimeout <= 0 {
		errs = append(errs, fmt.Errorf("block %v, claim idle %v (at least 10ms), claim every %v and ack timeout %v must be positive",
			c.Block, c.ClaimIdle, c.ClaimEvery, c.AckTimeout))
	}
	if err := c.Backoff.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}
