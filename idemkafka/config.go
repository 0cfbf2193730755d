package idemkafka

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"

	"github.com/idemkit/idem/internal/logfmt"
)

// DefaultIDHeader is the record header that carries the producer-assigned
// message ID when [Config.IDHeader] and [Config.ID] are unset.
const DefaultIDHeader = idembroker.HeaderMessageID

// DefaultTimeHeader is the record header that carries the producer's event
// time when [Config.TimeHeader] is unset.
const DefaultTimeHeader = idembroker.HeaderEventTime

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
	// RFC 3339 or Unix milliseconds. Defaults to "x-event-time". The event
	// time (idem.Message.Time) is taken from the most stable source a record
	// has, as idem.EventTime orders them: the time inside a UUIDv7 ID, this
	// header, the record timestamp; idem.Message.TimeSource says which. A
	// header that does not parse, on a record whose ID carries no time, is
	// bad input: the processor dead-letters the record (idem.ErrBadTime).
	TimeHeader string
	// Backoff paces this consumer's own tries with the broker and the
	// inbox: producing a dead letter the broker refused, resending an
	// offset commit, checking the inbox again; the pause doubles with each
	// try, with jitter, up to Backoff.Max. Backoff.Initial is also the
	// pause after a fetch error and before a record is run again when the
	// processor's disposition names no delay. How
	// often and how long a record is retried is the processor's decision
	// (idem.RetryPolicy), not this consumer's. Defaults to 100ms and 5s.
	Backoff idem.Backoff
	// DeadLetterTopic names the dead-letter topic of a topic. Defaults to
	// topic + ".dlq". Run checks at start that the dead-letter topic of
	// every consumed topic exists, and refuses to start otherwise (or
	// creates it, see CreateDeadLetterTopics): a dead letter with nowhere to
	// go would hold its partition.
	DeadLetterTopic func(topic string) string
	// CreateDeadLetterTopics lets Run create a missing dead-letter topic,
	// with the partition count and replication factor of the topic it
	// serves. Defaults to false: Run refuses to start and names the topic
	// to create, because a dead-letter topic's replication and retention are
	// the operator's choice and creating topics needs a permission a
	// consumer should not usually hold.
	CreateDeadLetterTopics bool
	// DeadLetterClient produces dead letters. Defaults to the consuming
	// client. It must require acks from all in-sync replicas (the default,
	// kgo.RequiredAcks(kgo.AllISRAcks())): the offset moves past a dead
	// letter as soon as the broker acknowledged it, so it must be durable.
	DeadLetterClient *kgo.Client
	// MaxPollRecords bounds the records taken from the client per poll.
	// Defaults to 5000.
	MaxPollRecords int
	// MaxBatch bounds the records of one partition that share one database
	// transaction. Defaults to 500.
	MaxBatch int
	// CommitTimeout bounds one offset commit, including the final one at
	// shutdown. Defaults to a quarter of the client's rebalance timeout, at
	// most 10s.
	CommitTimeout time.Duration
	// RebalanceGrace is how long the batches in flight may go on once a
	// rebalance waits for this consumer. At that signal the consumer stops
	// retrying and starts no new batch; what settled is committed, the
	// batches still running after RebalanceGrace are cancelled (rolled
	// back, nothing committed past them), and every record not settled is
	// given up to whoever owns its partition after the rebalance, this
	// consumer included, which runs it again. So neither a poison or slow
	// record nor a database outage holds a rebalance longer than
	// RebalanceGrace plus one CommitTimeout. Defaults to a quarter of the
	// client's rebalance timeout (15s with franz-go's default of 60s).
	// RebalanceGrace plus CommitTimeout must not exceed half the rebalance
	// timeout, so the member rejoins in time and keeps its place. The
	// cancel reaches the handler through its context; a handler that
	// ignores it is bounded only by the processor's idem.Config.TxTimeout.
	RebalanceGrace time.Duration
	// Hooks are hooks of this consumer alone, called after the
	// processor's (idem.Config.Hooks, which the consumer calls too): any
	// value implementing the broker hooks of package idembroker
	// (idembroker.SettleHook for every record settled,
	// idembroker.DeadLetterHook for every dead letter) or this package's
	// [CommitHook], [DataLossHook] and [RetryHook]. One list, optional
	// interfaces. [Consumer.Stats] counts the same events.
	// Optional.
	Hooks []idem.Hook
	// Positions records, per partition, how far the database has applied
	// it, in the transaction of the claims, and says what to do when the
	// database is behind the broker at a partition's assignment (a
	// failover to a replica that lagged, a backup restored): rewind to the
	// database's position (PositionsRewind) or refuse the partition
	// (PositionsRefuse). Defaults to PositionsOff. See [Positions].
	Positions Positions
	// Faults injects crashes between the database commit and the offset
	// commit, for tests and drills. Optional; see [FaultFunc].
	Faults FaultFunc
	// Logger receives retries, dead letters and commit failures. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// setDefaults fills the zero fields; rebalance is the client's rebalance
// timeout.
func (c *Config) setDefaults(rebalance time.Duration) {
	if c.IDHeader == "" {
		c.IDHeader = DefaultIDHeader
	}
	if c.TimeHeader == "" {
		c.TimeHeader = DefaultTimeHeader
	}
	c.Backoff = c.Backoff.WithDefaults(idem.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second})
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
		c.CommitTimeout = min(10*time.Second, rebalance/4)
	}
	if c.RebalanceGrace == 0 {
		c.RebalanceGrace = rebalance / 4
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	// Durations as text, errors on one line, whatever the handler.
	c.Logger = logfmt.Wrap(c.Logger)
}

func (c *Config) validate(rebalance time.Duration) error {
	var errs []error
	if err := c.Backoff.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxPollRecords < 1 || c.MaxBatch < 1 {
		errs = append(errs, fmt.Errorf("max poll records %d and max batch %d must be positive", c.MaxPollRecords, c.MaxBatch))
	}
	if c.Positions < PositionsOff || c.Positions > PositionsRefuse {
		errs = append(errs, fmt.Errorf("unknown positions setting %d", int(c.Positions)))
	}
	if c.CommitTimeout <= 0 || c.RebalanceGrace <= 0 {
		errs = append(errs, fmt.Errorf("commit timeout %v and rebalance grace %v must be positive", c.CommitTimeout, c.RebalanceGrace))
	} else if hold := c.RebalanceGrace + c.CommitTimeout; hold > rebalance/2 {
		errs = append(errs, fmt.Errorf("rebalance grace %v plus commit timeout %v may hold a rebalance %v, more than half the client's rebalance timeout %v: lower them or raise kgo.RebalanceTimeout",
			c.RebalanceGrace, c.CommitTimeout, hold, rebalance))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}
