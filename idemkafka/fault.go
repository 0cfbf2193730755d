package idemkafka

import (
	"context"
	"errors"

	"github.com/idemkit/idem"
)

// BeforeOffsetCommit: the records up to offset committed in the database,
// their offset has not been committed to Kafka. A crash here is the window
// that makes Kafka redeliver records whose effects are already durable.
const BeforeOffsetCommit idem.FaultPoint = "before_offset_commit"

// FaultFunc is called at every fault point, for tests and drills only. A
// non-nil error crashes the consumer there as [Consumer.Crash] does, and Run
// returns an error wrapping [ErrCrashed] and this error.
//
// It may block, to hold the consumer in the fault window (the incident
// demo holds offset commits this way until its simulated restart): the
// partition at hand waits with its offset uncommitted, the other partitions
// of the poll go on, and a rebalance waits until it returns. ctx ends when
// Run's context is cancelled, when the consumer crashes, and
// [Config.RebalanceGrace] after a rebalance started waiting for the
// consumer; a blocking FaultFunc should return then.
type FaultFunc func(ctx context.Context, point idem.FaultPoint, topic string, partition int32, offset int64) error

// ErrCrashed is wrapped by Run's error after [Consumer.Crash] or a fault.
var ErrCrashed = errors.New("idemkafka consumer crashed")
