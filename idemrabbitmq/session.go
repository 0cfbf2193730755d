package idemrabbitmq

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
)

// pending is a batch being gathered or processed.
type pending struct {
	deliveries []amqp.Delivery
	msgs       []idem.Message
	rerun      bool // deliveries held after a Retry that was not their fault
}

func (p *pending) tags() []uint64 {
	tags := make([]uint64, len(p.deliveries))
	for i := range p.deliveries {
		tags[i] = p.deliveries[i].DeliveryTag
	}
	return tags
}

func (p *pending) add(d amqp.Delivery, m idem.Message) {
	p.deliveries = append(p.deliveries, d)
	p.msgs = append(p.msgs, m)
}

// letter is one dead letter on its way to the dead-letter destination.
type letter struct {
	delivery amqp.Delivery
	d        decision
}

// work is what the session asks the loop to start now.
type work struct {
	batches []pending // to process, each on a worker
	letters []letter  // to publish to the dead-letter destination, then ack
}

// session is the state of one channel's consumption: which deliveries are
// where, and what may happen next. It does no I/O and reads no clock: the
// loop feeds it events with the time (a delivery, a finished batch, a
// dead-letter publish that ended, a tick, the stop) and carries out what it
// returns (frames to send, batches to process, dead letters to publish),
// so every rule here is tested without a broker.
//
// Invariant: every delivery of the channel that the broker was not told
// about yet is in exactly one place, and the tracker has its tag in the
// matching state: in the batch being gathered or in a worker (processing);
// held, to be processed again at heldAt (held); waiting for its requeue
// (waiting); in letters, waiting to be published, or out with the
// publisher (lettering); or finished and not acked yet because an
// earlier tag is still processing (ackable). A multiple ack covers only
// finished tags. At most Workers batches and one dead-letter publish are
// out at once, and a new batch starts only when a worker is free and
// nothing is held or waiting for a requeue: the database is then probably
// down, and new messages would only join the queue of the held ones.
type session struct {
	batchSize, workers int
	batchWait          time.Duration
	// prefetch is the channel's window: with as many deliveries unsettled,
	// the broker sends no more until something is acked, so a partial batch
	// has nothing to wait for. Zero: unknown.
	prefetch int
	// letterBackoff spaces publishes of dead letters that could not be
	// published.
	letterBackoff idem.Backoff

	tr        tracker
	gathering pending
	gatherDue time.Time // when the gathering batch starts even if not full
	inflight  int       // batches in workers
	reruns    int       // of them, re-runs of held deliveries
	held      pending
	heldAt    time.Time
	letters   []letter  // dead letters not yet out with the publisher
	lettersAt time.Time // when they may go out (after a failed publish)
	failures  int       // consecutive failed dead-letter publishes
	out       int       // dead letters out with the publisher
	stopping  bool
}

func newSession(cfg *Config) *session {
	return &session{
		batchSize: cfg.BatchSize, workers: cfg.Workers, batchWait: cfg.BatchWait, prefetch: cfg.Prefetch,
		letterBackoff: cfg.ReconnectBackoff,
	}
}

// intake reports whether the session takes more deliveries now.
func (s *session) intake() bool { return !s.stopping && len(s.gathering.msgs) < s.batchSize }

// deliver adds a delivery to the batch being gathered.
func (s *session) deliver(d amqp.Delivery, m idem.Message, now time.Time) {
	s.tr.add(d.DeliveryTag)
	if len(s.gathering.msgs) == 0 {
		s.gatherDue = now.Add(s.batchWait)
		if cap(s.gathering.msgs) == 0 {
			// A batch's slices go to its worker whole; the next batch
			// gets its own, sized once.
			s.gathering.deliveries = make([]amqp.Delivery, 0, s.batchSize)
			s.gathering.msgs = make([]idem.Message, 0, s.batchSize)
		}
	}
	s.gathering.add(d, m)
}

// finished records a processed batch, one decision per delivery, and
// returns the frames to send now.
func (s *session) finished(b pending, ds []decision, now time.Time) []op {
	s.inflight--
	if b.rerun {
		s.reruns--
	}
	var holding pending
	var holdDelay time.Duration
	for i := range ds {
		if s.stopping && ds[i].verb == Requeue {
			ds[i].disp.Delay = 0 // nothing waits once stopping
		}
		switch ds[i].verb {
		case Hold:
			holding.add(b.deliveries[i], b.msgs[i])
			holdDelay = max(holdDelay, ds[i].disp.Delay)
		case DeadLetter:
			s.letters = append(s.letters, letter{delivery: b.deliveries[i], d: ds[i]})
		}
	}
	ops := s.tr.finish(b.tags(), ds, now)
	if len(holding.msgs) > 0 && !s.stopping {
		// A shutdown leaves held deliveries unacked: closing the channel
		// returns them to the queue.
		s.held.deliveries = append(s.held.deliveries, holding.deliveries...)
		s.held.msgs = append(s.held.msgs, holding.msgs...)
		s.heldAt = later(s.heldAt, now.Add(holdDelay))
	}
	if s.stopping {
		ops = append(ops, s.tr.due(now)...)
	}
	return ops
}

// published records the end of a dead-letter publish: on success the
// originals are acked; on failure they stay unacked and are published
// again after a backoff.
func (s *session) published(ls []letter, err error, now time.Time) []op {
	s.out -= len(ls)
	if err != nil {
		s.failures++
		s.letters = append(ls, s.letters...)
		s.lettersAt = now.Add(s.letterBackoff.Delay(s.failures))
		return nil
	}
	s.failures = 0
	s.lettersAt = time.Time{}
	tags := make([]uint64, len(ls))
	for i := range ls {
		tags[i] = ls[i].delivery.DeliveryTag
	}
	return s.tr.lettered(tags)
}

// tick returns the requeues due at now.
func (s *session) tick(now time.Time) []op { return s.tr.due(now) }

// stop begins a shutdown: no new delivery is taken and no new batch
// starts; the gathered deliveries are forgotten (closing the channel
// returns them to the queue), requeues are sent at once, and the session
// is done once the batches in the database and the dead letters out with
// the publisher came back.
func (s *session) stop(now time.Time) []op {
	s.stopping = true
	ops := s.tr.forget(s.gathering.tags())
	s.gathering = pending{}
	return append(ops, s.tr.due(now.Add(24*time.Hour))...)
}

// done reports whether a stopping session has nothing left to wait for.
func (s *session) done() bool {
	return s.stopping && s.inflight == 0 && s.out == 0 && (len(s.letters) == 0 || s.failures > 0)
}

// next returns the work to start at now, and when to call next again if
// no other event comes first (zero: only an event can change anything).
func (s *session) next(now time.Time) (w work, wake time.Time) {
	// Dead letters go out whenever the publisher is free; once stopping,
	// only those that never failed (the others wait for redelivery).
	if s.out == 0 && len(s.letters) > 0 && (s.stopping && s.failures == 0 || !s.stopping && !now.Before(s.lettersAt)) {
		n := min(len(s.letters), maxLetters)
		w.letters = s.letters[:n:n]
		s.letters = s.letters[n:]
		s.out = n
	}
	if s.stopping {
		return w, time.Time{}
	}
	if len(s.held.msgs) > 0 && s.inflight < s.workers && !now.Before(s.heldAt) {
		b := s.held
		s.held = pending{}
		b.rerun = true
		s.tr.process(b.tags())
		s.reruns++
		s.inflight++
		w.batches = append(w.batches, b)
	}
	paused := s.tr.nWaiting > 0 || len(s.held.msgs) > 0 || s.reruns > 0
	// A partial batch starts before its wait is over when the window is
	// full: no delivery can join it before a batch is acked.
	windowFull := s.prefetch > 0 && s.tr.len() >= s.prefetch
	for n := len(s.gathering.msgs); n > 0 && (n >= s.batchSize || windowFull || !now.Before(s.gatherDue)) && s.inflight < s.workers && !paused; n = len(s.gathering.msgs) {
		k := min(n, s.batchSize)
		g := s.gathering
		w.batches = append(w.batches, pending{deliveries: g.deliveries[:k:k], msgs: g.msgs[:k:k]})
		s.gathering = pending{deliveries: g.deliveries[k:], msgs: g.msgs[k:]}
		s.inflight++
	}
	// Only what a tick can start wakes the loop; a batch waiting for a
	// free worker starts when a worker's batch comes back.
	free := s.inflight < s.workers
	if len(s.gathering.msgs) > 0 && free && !paused {
		wake = earlier(wake, s.gatherDue)
	}
	if t, ok := s.tr.nextDue(); ok {
		wake = earlier(wake, t)
	}
	if len(s.held.msgs) > 0 && free {
		wake = earlier(wake, s.heldAt)
	}
	if len(s.letters) > 0 && s.out == 0 {
		wake = earlier(wake, s.lettersAt)
	}
	return w, wake
}

// earlier is the earlier of two times, zero meaning none.
func earlier(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
