package idemkafka

import (
	"github.com/idemkit/idem"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Hooks receives what a [Consumer] does on the broker side, for metrics and
// tests; outcomes themselves are counted by the processor's idem.Observer.
// Methods are called concurrently from partition goroutines and must return
// quickly. Embed [NopHooks] to implement only some of them.
type Hooks interface {
	// OnCommit follows every offset commit of one partition; offset is the
	// next offset to consume and err is nil when the broker accepted it.
	OnCommit(topic string, partition int32, offset int64, err error)
	// OnRetry precedes a run in place of a record the processor handed back
	// (disposition Redeliver or Hold: a commit of unknown outcome, a
	// database outage, a missing inbox table); try is the number of the
	// coming run of the record through the processor, from 2. The tries
	// the processor makes inside one run (idem.RetryPolicy) are not seen
	// here.
	OnRetry(r *kgo.Record, try int, res idem.Result)
	// OnDeadLetter follows the production of a record to its dead-letter
	// topic; err is nil when the broker acknowledged it.
	OnDeadLetter(r *kgo.Record, res idem.Result, err error)
}

// NopHooks implements [Hooks] and does nothing.
type NopHooks struct{}

// OnCommit implements [Hooks].
func (NopHooks) OnCommit(string, int32, int64, error) {}

// OnRetry implements [Hooks].
func (NopHooks) OnRetry(*kgo.Record, int, idem.Result) {}

// OnDeadLetter implements [Hooks].
func (NopHooks) OnDeadLetter(*kgo.Record, idem.Result, error) {}
