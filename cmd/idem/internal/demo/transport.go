package demo

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem"
)

// transport is the broker under the scenario. Both sides consume the same
// published messages through the same adapter: a second queue bound to the
// same exchange (RabbitMQ), a second consumer group on the same topic
// (Kafka).
type transport interface {
	// describe names the broker for the report.
	describe() string
	// prepare creates what the streams need for both sides.
	prepare(ctx context.Context, p *plan) error
	// publish publishes every stream of p, copies included.
	publish(ctx context.Context, p *plan) error
	// start runs one side's consumer of stream until ctx ends.
	start(ctx context.Context, s *side, stream string, proc *idem.Processor[*sql.Tx], o *outage, published int) runningConsumer
	// close releases what prepare created.
	close(ctx context.Context)
}

// runningConsumer is a consumer started by a transport.
type runningConsumer interface {
	// acked counts the deliveries acknowledged (or whose offsets were
	// committed) so far.
	acked() int
	// finished reports whether every published message was acknowledged.
	finished() bool
	// wait returns once the consumer stopped after its context ended, with
	// the error that stopped it if it failed on its own.
	wait() error
}
