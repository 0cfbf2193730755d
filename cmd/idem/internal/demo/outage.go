package demo

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errRestart is what a held acknowledgement returns when the broker
// "restarts": the adapter withholds the ack (RabbitMQ) or the offset commit
// (Kafka) and drops the connection or the member, as the incident's broker
// restart did.
var errRestart = errors.New("broker restarted: acknowledgements in flight were lost")

// outage replays the incident on one consumer. Once `after` deliveries were
// acknowledged normally, it holds every batch that committed in the
// database at the point where the adapter would acknowledge it, until about
// `target` deliveries are held (or no new batch arrives for a while: every
// worker is holding one). Then it "restarts the broker": every held batch
// fails its acknowledgement, the adapter loses its connection or member, and
// the broker redelivers all of them. It fires once per consumer.
type outage struct {
	after, target int
	stall         time.Duration

	mu      sync.Mutex
	passed  int
	held    int
	holding bool
	over    bool
	release chan struct{}
	timer   *time.Timer
}

func newOutage(after, target int) *outage {
	return &outage{after: after, target: max(1, target), stall: 300 * time.Millisecond, release: make(chan struct{})}
}

// hold is called by the adapter's fault seam with the n deliveries of a
// batch whose transaction committed and whose acknowledgement is next.
func (o *outage) hold(ctx context.Context, n int) error {
	o.mu.Lock()
	switch {
	case o.over:
		o.mu.Unlock()
		return nil
	case !o.holding:
		o.passed += n
		if o.passed >= o.after {
			o.holding = true
		}
		o.mu.Unlock()
		return nil
	}
	o.held += n
	if o.held >= o.target {
		o.restartLocked()
	} else if o.timer == nil {
		o.timer = time.AfterFunc(o.stall, o.restart)
	} else {
		o.timer.Reset(o.stall)
	}
	o.mu.Unlock()
	select {
	case <-o.release:
		return errRestart
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (o *outage) restart() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.restartLocked()
}

func (o *outage) restartLocked() {
	if o.over {
		return
	}
	o.over = true
	if o.timer != nil {
		o.timer.Stop()
	}
	close(o.release)
}

// state reports whether acknowledgements are being held, whether the
// restart happened, and how many deliveries it caught processed but
// unacknowledged.
func (o *outage) state() (holding, over bool, held int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.holding && !o.over, o.over, o.held
}
