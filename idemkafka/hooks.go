package idemkafka

import (
	"github.com/idemkit/idem"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The consumer's own hooks, for events only Kafka has, beside the broker
// hooks of package idembroker (idembroker.SettleHook, DeadLetterHook):
// optional interfaces that any value in the
// processor's hooks (idem.Config.Hooks) or in [Config.Hooks] may
// implement, for tests, drills and broker-side metrics. Methods are called
// concurrently from partition goroutines and must return quickly.

// CommitHook follows every offset commit of one partition; offset is the
// next offset to consume and err is nil when the broker accepted it.
type CommitHook interface {
	OnCommit(topic string, partition int32, offset int64, err error)
}

// DataLossHook follows the client's report that the log of a partition
// ends below what it had consumed (kgo.ErrDataLoss, after an unclean
// leader election): it resumes at resetTo, and the consumer commits again
// from there, below offsets it committed before. Records between resetTo
// and consumedTo the producers had seen acknowledged are gone from the
// broker; no consumer can apply them.
type DataLossHook interface {
	OnDataLoss(topic string, partition int32, consumedTo, resetTo int64)
}

// RetryHook precedes a run in place of a record the processor handed back
// (disposition Redeliver or Hold: a commit of unknown outcome, a database
// outage, a missing inbox table); try is the number of the coming run of
// the record through the processor, from 2. The tries the processor makes
// inside one run (idem.RetryPolicy) are not seen here.
type RetryHook interface {
	OnRetry(r *kgo.Record, try int, res idem.Result)
}
