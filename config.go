package idem

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/idemkit/idem/internal/logfmt"
)

// Config configures a [Processor]. Pass it to [NewProcessor], which applies
// the defaults below and refuses an invalid configuration.
type Config[TTx any] struct {
	// Consumer names the consumer; its markers are kept apart from every
	// other consumer's. Required; must match ^[a-z][a-z0-9_.-]{0,62}$.
	// Renaming a consumer forgets its markers: treat the name as permanent.
	Consumer string
	// Key returns the inbox key of a message's effect. Required unless
	// Natural is set: there is no silent default. [ByMessageID] is the common
	// choice; [JSONKey] builds business keys.
	Key KeyFunc
	// Handler applies the effect inside the claim's transaction. Required
	// unless HandleBatch is set.
	Handler Handler[TTx]
	// HandleBatch, when set, replaces Handler: it is called once per
	// transaction with every freshly claimed message, in message order, so
	// it can write them all with one statement or one pipelined batch. On a
	// batch of 100 this removes 99 round trips per transaction. An error
	// fails the whole batch, which is then retried message by message.
	HandleBatch BatchHandler[TTx]
	// Natural declares the effect naturally idempotent (a set, an upsert, a
	// recompute): no marker is written, but the handler still runs in a
	// transaction with the same outcome, ack and dead-letter discipline.
	Natural bool
	// Retry is the in-process retry policy for transient failures.
	Retry RetryPolicy
	// LockTimeout bounds how long a claim waits for a concurrent transaction
	// holding the same key, so a hung holder cannot stall the consumer.
	// Defaults to 5s. -1 leaves the database default. On PostgreSQL it is
	// set for the whole transaction (SET LOCAL), so it bounds the handler's
	// lock waits too, and with ProcessTx the caller's later statements.
	LockTimeout time.Duration
	// Logger receives one record per outcome worth telling. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Horizon guards against messages older than the inbox retention window:
	// they get Expired. When Horizon.Window is 0 the processor takes the
	// store's horizon (pgxinbox and sqlinbox offer one that matches their
	// prune window), so pruning and the guard agree by default. Window -1
	// disables the guard.
	Horizon Horizon
	// PartitionTime derives a message's partition time from its inbox key,
	// for a partitioned inbox (docs/design.md 7): the time must be a function of
	// the key alone, so that every copy of a message, republished with any
	// timestamp, lands on its marker. For "invoice:<customer>:<period>",
	// return the period's start, and keep a retention window longer than a
	// period plus how late its messages may come: the horizon expires a
	// message once its partition time is older than the window. Defaults, for a consumer keyed
	// [ByMessageID], to the time inside a UUIDv7 ID ([TimeFromUUIDv7]); a
	// consumer of a partitioned inbox keyed otherwise must set it, or
	// NewProcessor refuses. A key it cannot place is dead-lettered, wrapping
	// [ErrNoPartitionTime]. Ignored on the plain layout.
	PartitionTime func(key string) (time.Time, error)
	// RefuseUntimed dead-letters messages that carry no event time
	// (wrapping [ErrUntimed]) instead of applying them. An untimed message's
	// marker is kept a window after it was written; a replay after that
	// cannot be told from a new message. Off by default: untimed messages
	// are applied, counted (Result.Untimed) and logged once a minute.
	RefuseUntimed bool
	// RefuseLate refuses a message whose key a prune deleted (the store
	// keeps summaries of pruned keys, see
	// [github.com/idemkit/idem/idemstore.Store.PrunedSummaries]): it is
	// probably a late duplicate, a replay older than the window or an
	// untimed message come back after its marker went. Its outcome is
	// Expired, wrapping [ErrMarkerPruned], with the day of the prune. Off
	// by default: such a message is applied, flagged (Result.PrunedOn) and
	// logged once a minute. A summary answers yes for about one key in a
	// million it never saw, so a refused message may be new: redrive it on
	// purpose to a consumer without RefuseLate. The check reads the
	// summaries in the claim's own transaction, so a prune that committed
	// before the claim is seen; a ProcessTx caller whose transaction runs at
	// REPEATABLE READ or stricter and read before calling has a snapshot
	// older than its claim, and should run such transactions at READ
	// COMMITTED (PostgreSQL's default; MySQL's is REPEATABLE READ).
	RefuseLate bool
	// TxTimeout bounds one transaction, from BEGIN to the handler's end, so
	// that a half-open connection cannot stall a worker until TCP gives up.
	// Defaults to 30s. -1 leaves it unbounded.
	TxTimeout time.Duration
	// CommitTimeout bounds COMMIT, which runs even while the caller shuts
	// down (a finished commit beats one of unknown outcome). A COMMIT that
	// outlives it is reported as of unknown outcome ([ErrCommitUnknown]).
	// Defaults to 10s. -1 leaves it unbounded.
	CommitTimeout time.Duration
	// Hooks receive what the processor and the broker adapters over it do:
	// outcomes, failed tries, settlements, dead letters. Optional; package
	// idemprom's Metrics implements every hook. See [Hook].
	Hooks []Hook
	// Faults injects failures at named points, for tests. Optional.
	Faults FaultFunc
}

var consumerName = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// ErrConfig is wrapped by every configuration error from [NewProcessor].
var ErrConfig = errors.New("invalid idem configuration")

func (c *Config[TTx]) setDefaults() {
	c.Retry.setDefaults()
	c.Horizon.setDefaults()
	if c.LockTimeout == 0 {
		c.LockTimeout = 5 * time.Second
	}
	if c.TxTimeout == 0 {
		c.TxTimeout = 30 * time.Second
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	// Durations as text, errors on one line, whatever the handler.
	c.Logger = logfmt.Wrap(c.Logger)
}

func (c *Config[TTx]) validate() error {
	var errs []error
	if !consumerName.MatchString(c.Consumer) {
		errs = append(errs, fmt.Errorf("consumer name %q must match %s", c.Consumer, consumerName))
	}
	if c.Key == nil && !c.Natural {
		errs = append(errs, errors.New("key func is required (use idem.ByMessageID or a business key); set Natural for an effect with no marker"))
	}
	switch {
	case c.Handler == nil && c.HandleBatch == nil:
		errs = append(errs, errors.New("handler is required"))
	case c.Handler != nil && c.HandleBatch != nil:
		errs = append(errs, errors.New("set Handler or HandleBatch, not both"))
	}
	if c.Retry.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("retry max attempts %d must be at least 1", c.Retry.MaxAttempts))
	}
	if c.Retry.MaxContention < -1 {
		errs = append(errs, fmt.Errorf("retry max contention %d must be positive or -1", c.Retry.MaxContention))
	}
	if err := c.Retry.Backoff.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("retry %w", err))
	}
	if err := c.Horizon.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.TxTimeout < -1 || c.CommitTimeout < -1 {
		errs = append(errs, fmt.Errorf("transaction timeout %v and commit timeout %v must be positive or -1", c.TxTimeout, c.CommitTimeout))
	}
	if c.LockTimeout < -1 {
		errs = append(errs, fmt.Errorf("lock timeout %v must be positive or -1", c.LockTimeout))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}
