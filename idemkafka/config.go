package idemkafka

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultIDHeader is the record header that carries the producer-assigned
// message ID when [Config.IDHeader] and [Config.ID] are unset.
const DefaultIDHeader = "idem-message-id"

// ErrConfig is wrapped by every configuration error from [NewConsumer] and
// [New].
var ErrConfig = errors.New("invalid idemkafka configuration")

// Config configures a [Consumer]. The zero value is usable; [NewConsumer]
// applies the defaults below and refuses an invalid configuration.
type Config struct {
	// IDHeader names the record header holding the message ID. Defaults to
	// "idem-message-id". Ignored when ID is set.
	IDHeader string
	// ID extracts the message ID from a record, for producers that put it
	// elsewhere (the key, a JSON field). Optional. An error or an empty ID
	// sends the record to the dead-letter topic. Never return the offset: a
	// replay or a republish changes it.
	ID func(*kgo.Record) (string, error)
	// TimeHeader names a header holding the producer's event time, as
	// RFC 3339 or Unix milliseconds; it becomes idem.Message.Time. Optional;
	// a header that does not parse sends the record to the dead-letter topic.
	TimeHeader string
	// RecordTimeStable says the record timestamp is the producer's event time
	// and survives republishing, so it may serve as idem.Message.Time when
	// TimeHeader is unset. Defaults to false: Time stays zero.
	RecordTimeStable bool
	// MaxAttempts is how many times a record whose outcome is Retry is tried
	// in place before it is dead-lettered. Each try runs the processor's own
	// retry policy. Defaults to 10. It bounds how long a poison record can
	// hold its partition and how long a rebalance may wait for it.
	//
	// Only tries that failed because of the record count: a handler error,
	// a transient database error (deadlock, serialization failure, lock
	// timeout) that outlived the processor's retries, a commit whose outcome
	// is unknown (a handler slower than the server's idle timeout ends that
	// way every time, so it must not loop). A Retry the processor marks
	// Blameless backs off and tries again without counting, for as long as
	// Run's context lives: the inbox database stayed unreachable past the
	// processor's RetryPolicy.WaitUnavailable (idem.ErrUnavailable), or the
	// record was not tried because an earlier one in its partition must be
	// retried first (idem.ErrNotAttempted). So a database outage holds the
	// partitions, and a rebalance, until the database is back or the
	// consumer stops, but dead-letters no healthy record.
	MaxAttempts int
	// InitialBackoff is the pause before the second try of a record; the
	// pause doubles with each try, counted or not, with jitter, as
	// idem.RetryPolicy's Backoff does. Defaults to 100ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the pause between tries. Defaults to 5s.
	MaxBackoff time.Duration
	// DeadLetterTopic names the dead-letter topic of a topic. Defaults to
	// topic + ".dlq". The topic must exist (or the cluster must create
	// topics on first use): until a dead letter is acknowledged, its
	// partition waits, because moving past it would lose the record.
	DeadLetterTopic func(topic string) string
	// DeadLetterClient produces dead letters. Defaults to the consuming
	// client.
	DeadLetterClient *kgo.Client
	// MaxPollRecords bounds the records taken from the client per poll.
	// Defaults to 5000.
	MaxPollRecords int
	// MaxBatch bounds the records of one partition that share one database
	// transaction. Defaults to 500.
	MaxBatch int
	// CommitTimeout bounds one offset commit, including the final one at
	// shutdown. Defaults to 10s.
	CommitTimeout time.Duration
	// Hooks receives commits and dead letters, for metrics. Optional.
	Hooks Hooks
	// Faults injects crashes between the database commit and the offset
	// commit, for tests and drills. Optional; see [FaultFunc].
	Faults FaultFunc
	// Logger receives retries, dead letters and commit failures. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.IDHeader == "" {
		c.IDHeader = DefaultIDHeader
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.InitialBackoff == 0 {
		c.InitialBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.DeadLetterTopic == nil {
		c.DeadLetterTopic = func(topic string) string { return topic + ".dlq" }
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = 5000
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 500
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("max attempts %d must be at least 1", c.MaxAttempts))
	}
	if c.InitialBackoff < 0 || c.MaxBackoff < c.InitialBackoff {
		errs = append(errs, fmt.Errorf("backoff %v..%v is not a valid range", c.InitialBackoff, c.MaxBackoff))
	}
	if c.MaxPollRecords < 1 || c.MaxBatch < 1 {
		errs = append(errs, fmt.Errorf("max poll records %d and max batch %d must be positive", c.MaxPollRecords, c.MaxBatch))
	}
	if c.CommitTimeout < 0 {
		errs = append(errs, fmt.Errorf("commit timeout %v must be positive", c.CommitTimeout))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}
