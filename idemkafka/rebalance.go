package idemkafka

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// waiting maps a running consumer's client to its rebalance signal. The
// client's OnPartitionsCallbackBlocked option is set before any consumer
// exists ([GroupOptions]), so the callback finds its consumer here.
var waiting sync.Map // *kgo.Client → *rebalanceSignal

// rebalanceWaiting is the client's OnPartitionsCallbackBlocked: franz-go
// calls it, in a goroutine of its own, when a rebalance starts waiting for
// the poll being processed (BlockRebalanceOnPoll).
func rebalanceWaiting(_ context.Context, cl *kgo.Client) {
	if s, ok := waiting.Load(cl); ok {
		s.(*rebalanceSignal).raise()
	}
}

// rebalanceSignal tells the processing of one poll that a rebalance waits
// for it. Invariant: ch is nil between polls (a late call of the callback
// then changes nothing), and is closed at most once per poll.
type rebalanceSignal struct {
	mu     sync.Mutex
	ch     chan struct{}
	raised bool
	count  func() // counts a rebalance that waited for the consumer
}

// arm returns the channel closed when a rebalance waits for the poll about
// to be processed.
func (s *rebalanceSignal) arm() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ch, s.raised = make(chan struct{}), false
	return s.ch
}

// disarm ends the poll: a signal from now on is late, for a rebalance
// that no longer waits.
func (s *rebalanceSignal) disarm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ch = nil
}

func (s *rebalanceSignal) raise() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil && !s.raised {
		s.raised = true
		close(s.ch)
		if s.count != nil {
			s.count()
		}
	}
}
