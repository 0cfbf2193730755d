package idemrabbitmq

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"

	"github.com/idemkit/idem/internal/logfmt"
)

// Config configures a [Consumer]. Pass it to [NewConsumer], which applies
// the defaults below and refuses an invalid configuration.
type Config struct {
	// URL is the broker's AMQP URI, e.g. amqp://guest:guest@127.0.0.1:5672/:
	// the one-node form of URLs. Set URL or URLs, not both.
	URL string
	// URLs are the AMQP URIs of a cluster's nodes, e.g. one per node of a
	// 3-node cluster. A connection goes to one node at a time: when it is
	// lost (the node died, or the network cut it), the consumer reconnects
	// to the next node of the list, round-robin, so a node that died is not
	// dialled first again; a node that refuses a connection (or does not
	// answer within the dial timeout, 30s unless AMQP.Dial says otherwise)
	// is skipped for the next one at once, and only when every node failed
	// does the consumer wait its reconnect backoff. A quorum queue is
	// reachable from every node, so consumption goes on on any survivor.
	// URL or URLs is required.
	URLs []string
	// Queue is the queue to consume. Required. The consumer does not declare
	// it; see [DeclareQuorumWithDLQ] for a topology that ends crash-looping
	// messages in a dead-letter queue.
	Queue string
	// Prefetch is the basic.qos prefetch count: how many unacknowledged
	// deliveries the broker lets this consumer hold. Defaults to 500. It must
	// be at least BatchSize, or batches could never fill.
	Prefetch int
	// BatchSize is the most deliveries processed in one transaction.
	// Defaults to 100. 1 processes each message alone.
	BatchSize int
	// BatchWait is how long a partial batch waits for more deliveries before
	// it is processed anyway. Defaults to 20ms.
	BatchWait time.Duration
	// Workers is how many batches may be in the database at once. Defaults
	// to 1, which keeps the queue's order. More workers raise throughput
	// when the database round trip dominates, at the price of order: two
	// batches of one queue may then commit in either order. Deliveries are
	// still acknowledged only when committed, and a multiple ack never covers
	// a delivery another worker still holds.
	//
	// When the messages of a queue update the same hot rows (an account
	// balance, a stock level), concurrent batches queue on those rows'
	// locks, or deadlock when they take them in different orders (a
	// deadlock rolls a batch back and retries it): more workers then cost
	// throughput. Keep one worker for such a consumer, or write the effects
	// of a batch with a HandleBatch (idem.Config) that takes the rows in
	// key order, so that overlapping batches wait for each other instead of
	// deadlocking.
	Workers int
	// IDHeader names the header that carries the message identity. Empty
	// (the default) uses the AMQP message_id property. When set, only the
	// header is read; a delivery without it is dead-lettered.
	IDHeader string
	// DeadLetterQueue is where dead letters go: the queue the consumer
	// republishes each dead-lettered or expired message to, persistent and
	// with publisher confirms, with the original properties and headers
	// plus x-idem-reason, x-idem-outcome, x-idem-consumer, x-idem-attempts
	// and x-idem-origin; the original is acked only once the broker
	// confirmed the copy. At start, the consumer declares the queue
	// (durable, quorum) when it does not exist yet, and refuses to start
	// when the broker refuses that. Defaults to "<Queue>.dlq", the
	// dead-letter queue [DeclareQuorumWithDLQ] declares.
	DeadLetterQueue string
	// DeadLetterExchange, when set, routes dead letters through this
	// exchange with DeadLetterRoutingKey instead of straight to
	// DeadLetterQueue. At start, the consumer checks that the exchange
	// exists and binds DeadLetterQueue to it with DeadLetterRoutingKey, so
	// that the route exists; it refuses to start when either fails. Empty
	// (the default) publishes through the default exchange.
	// [Topology.DeadLetterExchange] is a usual value.
	DeadLetterExchange string
	// DeadLetterRoutingKey is the routing key of dead letters published
	// through DeadLetterExchange. Defaults to Queue, which is what
	// [DeclareQuorumWithDLQ] binds.
	DeadLetterRoutingKey string
	// DeadLetterURL is the broker URI of the connection dead letters are
	// published on, the one-node form of DeadLetterURLs; set one or neither.
	// Dead letters always go out on a connection of their own: under a
	// memory or disk alarm the broker blocks every connection that
	// publishes, and the consuming connection, which never publishes, keeps
	// delivering and acking while dead letters wait, unacked, for the alarm
	// to clear.
	DeadLetterURL string
	// DeadLetterURLs are the nodes of the dead-letter connection, chosen as
	// for URLs (each connection keeps its own turn). Defaults to the
	// consumer's URLs (or URL) when neither is set.
	DeadLetterURLs []string
	// ReconnectBackoff paces reconnecting after the connection or channel
	// was lost: the first wait is ReconnectBackoff.Initial, doubled up to
	// ReconnectBackoff.Max, with jitter ([idem.Backoff.Delay]), reset once
	// a session consumed successfully. The same range spaces the publishes
	// of dead letters the broker did not take (unroutable, nacked) and the
	// checks of an inbox unreachable at start. How often and how long a
	// message is retried is the processor's RetryPolicy, not this. Defaults
	// to 100ms and 10s.
	ReconnectBackoff idem.Backoff
	// ShutdownGrace is how long, after Run's context is cancelled or the
	// connection was lost, batches in flight may keep running to their
	// commit before their transactions are cancelled (rolled back, left to
	// redelivery). Defaults to 10s.
	ShutdownGrace time.Duration
	// ConnectionName is the client-provided connection name shown by the
	// management UI and rabbitmqctl. Defaults to "idem-<consumer>".
	ConnectionName string
	// AMQP is the connection configuration (TLS, SASL, heartbeat, vhost).
	// Optional. Its Recovery setting must stay nil: the consumer reconnects
	// by itself, and a library-recovered channel would accept acks for tags
	// of the channel that died.
	AMQP *amqp.Config
	// Logger receives connection events. Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks are hooks of this consumer alone, called after the
	// processor's (idem.Config.Hooks, which the consumer calls too): any
	// value implementing the broker hooks of package idembroker
	// (idembroker.SettleHook, DeadLetterHook, RedeliveredHook,
	// ReconnectHook). One list, optional interfaces: package idemprom's
	// Metrics needs no adapter. A settlement's broker verb is
	// [VerbFor] of its disposition's action. Optional.
	Hooks []idem.Hook
	// Faults injects failures at the adapter's fault points, for tests and
	// drills. Optional; nil costs nothing.
	//
	// It is called at [BeforeSettle] with the batch's messages. A non-nil
	// error makes the step fail there. It runs on the batch's worker and
	// may block: a drill that holds a committed batch's acks blocks there
	// (for as long as it likes, or until ctx, cancelled after
	// [Config.ShutdownGrace] once Run is stopping, is done) and then
	// returns an error to cut the connection, so the broker redelivers what
	// committed and the inbox turns it into duplicates. While it blocks,
	// that worker takes no other batch.
	Faults idem.FaultFunc
}

// BeforeSettle: the batch's transaction has ended (committed, for the
// Applied messages) and the broker has not been told yet. An error there
// withholds every ack of the batch and cuts the connection, exactly as a
// crash or a broker restart between commit and ack would: the broker
// redelivers, and the inbox turns the redeliveries into duplicates.
const BeforeSettle idem.FaultPoint = "before_settle"

// ErrConfig is wrapped by every configuration error from [NewConsumer].
var ErrConfig = errors.New("invalid idemrabbitmq configuration")

func (c *Config) setDefaults(consumer string) {
	if c.Prefetch == 0 {
		c.Prefetch = 500
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.BatchWait == 0 {
		c.BatchWait = 20 * time.Millisecond
	}
	if c.Workers == 0 {
		c.Workers = 1
	}
	if c.DeadLetterQueue == "" {
		c.DeadLetterQueue = c.Queue + ".dlq"
	}
	if c.DeadLetterRoutingKey == "" {
		c.DeadLetterRoutingKey = c.Queue
	}
	if c.DeadLetterURL == "" && len(c.DeadLetterURLs) == 0 {
		c.DeadLetterURLs = c.URLs
		if len(c.URLs) == 0 {
			c.DeadLetterURL = c.URL
		}
	}
	c.ReconnectBackoff = c.ReconnectBackoff.WithDefaults(idem.Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second})
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.ConnectionName == "" {
		c.ConnectionName = "idem-" + consumer
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	// Durations as text, errors on one line, whatever the handler.
	c.Logger = logfmt.Wrap(c.Logger)
}

func (c *Config) validate() error {
	var errs []error
	errs = append(errs, validateURLs("", c.URL, c.URLs)...)
	if c.Queue == "" {
		errs = append(errs, errors.New("queue is required"))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("batch size %d must be at least 1", c.BatchSize))
	}
	if c.Prefetch < c.BatchSize || c.Prefetch > 65535 {
		errs = append(errs, fmt.Errorf("prefetch %d must be between batch size %d and 65535", c.Prefetch, c.BatchSize))
	}
	if c.BatchWait < 0 {
		errs = append(errs, fmt.Errorf("batch wait %v must not be negative", c.BatchWait))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("workers %d must be at least 1", c.Workers))
	}
	if c.URL != "" || len(c.URLs) > 0 {
		errs = append(errs, validateURLs("dead-letter ", c.DeadLetterURL, c.DeadLetterURLs)...)
	}
	if c.Queue != "" && c.DeadLetterQueue == c.Queue {
		errs = append(errs, fmt.Errorf("dead-letter queue %q must not be the consumed queue", c.DeadLetterQueue))
	}
	if err := c.ReconnectBackoff.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("reconnect %w", err))
	}
	if c.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("shutdown grace %v must not be negative", c.ShutdownGrace))
	}
	if c.AMQP != nil && c.AMQP.Recovery != nil {
		errs = append(errs, errors.New("AMQP.Recovery must be nil: the consumer reconnects by itself and must never ack an old tag on a recovered channel"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// validateURLs checks the one-node and the list form of a connection's
// nodes: exactly one form set, and every URI parsable.
func validateURLs(what, url string, urls []string) []error {
	switch {
	case url == "" && len(urls) == 0:
		return []error{fmt.Errorf("%sURL or URLs is required", what)}
	case url != "" && len(urls) > 0:
		return []error{fmt.Errorf("%sURL and URLs are both set: set one", what)}
	}
	var errs []error
	if url != "" {
		urls = []string{url}
	}
	for i, u := range urls {
		if _, err := amqp.ParseURI(u); err != nil {
			// The URI's own text may hold a password: say which one.
			if len(urls) == 1 {
				errs = append(errs, fmt.Errorf("parsing %sURL: %w", what, err))
			} else {
				errs = append(errs, fmt.Errorf("parsing %sURL %d of %d: %w", what, i+1, len(urls), err))
			}
		}
	}
	return errs
}

// nodeURLs is a connection's nodes, from the one-node or the list form.
func nodeURLs(url string, urls []string) []string {
	if len(urls) > 0 {
		return slices.Clone(urls)
	}
	return []string{url}
}
