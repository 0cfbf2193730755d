package idemrabbitmq

import (
	"time"

	"github.com/idemkit/idem"
)

// Verb is what the consumer does with one delivery at the broker.
type Verb int

const (
	// Ack: basic.ack. The effect committed (Applied) or had committed before
	// (Duplicate); the broker may forget the message. Several finished
	// deliveries share one multiple ack when that covers nothing unfinished.
	Ack Verb = iota + 1
	// Requeue: basic.nack with requeue, after the disposition's delay. The
	// message was not applied and its try counted (a commit whose outcome
	// is unknown); the broker delivers it again, and a quorum queue counts
	// the delivery towards its x-delivery-limit.
	Requeue
	// DeadLetter: the message is republished, persistent and with
	// publisher confirms, to the dead-letter destination on the consumer's
	// dead-letter connection ([Config.DeadLetterQueue]), carrying
	// x-idem-reason and the other x-idem-* headers; the original is acked
	// only once the broker confirmed the copy. A copy that cannot be
	// published (unroutable, nacked, the connection blocked or lost) is
	// kept unacked and published again: a dead letter is never dropped.
	DeadLetter
	// Hold: nothing is sent. The message was not applied and it was not
	// its fault (the inbox database unreachable or not set up, a
	// shutdown); the delivery stays unacked and is processed again in this
	// session after the disposition's delay, so no delivery count of the
	// broker's is spent. Hold never reaches an idembroker.SettleHook: nothing was
	// settled.
	Hold
)

// String returns the lower-case name used in logs and metric labels.
func (v Verb) String() string {
	switch v {
	case Ack:
		return "ack"
	case Requeue:
		return "requeue"
	case DeadLetter:
		return "dead_letter"
	case Hold:
		return "hold"
	}
	return "unknown"
}

// VerbFor is the consumer's one table from the processor's decision
// ([idem.Processor.Dispose]) to broker verbs. The consumer decides nothing
// else about a message: how often it is tried, how long it waits and
// whether it is dead-lettered are all the processor's.
//
//   - ActionAck → Ack, only after the commit
//   - ActionRedeliver → Requeue after Delay
//   - ActionHold → Hold, processed again after Delay
//   - ActionDeadLetter → DeadLetter: confirmed republish, then ack
//   - anything else → Requeue: when in doubt, let the broker keep it
func VerbFor(a idem.Action) Verb {
	switch a {
	case idem.ActionAck:
		return Ack
	case idem.ActionRedeliver:
		return Requeue
	case idem.ActionHold:
		return Hold
	case idem.ActionDeadLetter:
		return DeadLetter
	}
	return Requeue
}

// tagState is where one delivery tag of the current channel stands.
type tagState int8

const (
	processing tagState = iota // gathered into a batch, or in the database
	ackable                    // finished; may be acked
	waiting                    // to be nacked with requeue when due
	held                       // not its fault; to be processed again
	lettering                  // its dead letter is not confirmed yet
)

// decision is what became of one delivery: the processor's result, its
// disposition and the verb the table maps it to. It is made once, in the
// worker, and carried unchanged to the frame, the stats and the hooks.
type decision struct {
	verb Verb
	disp idem.Disposition
	res  idem.Result
}

// decide is the decision for one result: the disposition the processor
// gives it, through [VerbFor].
func decide(d idem.Disposition, res idem.Result) decision {
	return decision{verb: VerbFor(d.Action), disp: d, res: res}
}

type tagEntry struct {
	tag   uint64
	state tagState
	due   time.Time // for waiting
	d     decision
}

// tracker holds every delivery tag of one channel that the broker has not
// been told about yet, in delivery order. It decides how acks are sent so
// that a multiple ack never covers a delivery that is not finished. A
// tracker belongs to one channel: when the channel dies, the tracker is
// dropped with it, because its tags mean nothing on the next channel
// (acking them there closes it with 406 PRECONDITION_FAILED).
type tracker struct {
	entries  []tagEntry // ascending tags: the broker numbers deliveries in order
	nWaiting int        // entries in state waiting
}

// op is one frame to send to the broker.
type op struct {
	verb     Verb // Ack or Requeue: the frame, not the message's fate
	tag      uint64
	multiple bool       // ack only
	settled  []decision // of the deliveries this frame settles, for stats and hooks
}

func (t *tracker) add(tag uint64) {
	t.entries = append(t.entries, tagEntry{tag: tag, state: processing})
}

func (t *tracker) len() int { return len(t.entries) }

func (t *tracker) find(tag uint64) int {
	// Entries are few (at most the prefetch) and ascending.
	lo, hi := 0, len(t.entries)
	for lo < hi {
		m := (lo + hi) / 2
		if t.entries[m].tag < tag {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(t.entries) && t.entries[lo].tag == tag {
		return lo
	}
	return -1
}

// finish records a batch's decisions, one per tag, at now. It returns the
// acks that became possible; requeues wait until due ([tracker.due]), held
// deliveries until they are processed again ([tracker.process]), dead
// letters until their copy is confirmed ([tracker.lettered]).
func (t *tracker) finish(tags []uint64, ds []decision, now time.Time) []op {
	for i, tag := range tags {
		j := t.find(tag)
		if j < 0 {
			continue
		}
		e := &t.entries[j]
		e.d = ds[i]
		switch ds[i].verb {
		case Ack:
			e.state = ackable
		case Hold:
			e.state = held
		case DeadLetter:
			e.state = lettering
		default:
			e.state, e.due = waiting, now.Add(ds[i].disp.Delay)
			t.nWaiting++
		}
	}
	return t.acks()
}

// lettered marks the tags whose dead letters the broker confirmed as
// finished, and returns the acks that became possible.
func (t *tracker) lettered(tags []uint64) []op {
	for _, tag := range tags {
		if j := t.find(tag); j >= 0 && t.entries[j].state == lettering {
			t.entries[j].state = ackable
		}
	}
	return t.acks()
}

// due returns the nacks whose wait is over at now, and the acks they
// unblock.
func (t *tracker) due(now time.Time) []op {
	var ops []op
	for j := 0; j < len(t.entries); {
		e := t.entries[j]
		if e.state == waiting && !e.due.After(now) {
			ops = append(ops, op{verb: Requeue, tag: e.tag, settled: []decision{e.d}})
			t.remove(j)
			t.nWaiting--
			continue
		}
		j++
	}
	return append(ops, t.acks()...)
}

// process marks tags as being processed (again).
func (t *tracker) process(tags []uint64) {
	for _, tag := range tags {
		if j := t.find(tag); j >= 0 {
			if t.entries[j].state == waiting {
				t.nWaiting--
			}
			t.entries[j].state = processing
		}
	}
}

// forget drops tags the consumer will never settle on this channel
// (gathered but not processed when a shutdown began): closing the channel
// returns them to the queue. It returns the acks that became possible.
func (t *tracker) forget(tags []uint64) []op {
	for _, tag := range tags {
		if j := t.find(tag); j >= 0 {
			if t.entries[j].state == waiting {
				t.nWaiting--
			}
			t.remove(j)
		}
	}
	return t.acks()
}

// nextDue returns the earliest time a waiting requeue falls due.
func (t *tracker) nextDue() (time.Time, bool) {
	var next time.Time
	if t.nWaiting == 0 {
		return next, false
	}
	for _, e := range t.entries {
		if e.state == waiting && (next.IsZero() || e.due.Before(next)) {
			next = e.due
		}
	}
	return next, !next.IsZero()
}

// acks returns the acks possible now. The finished prefix of the tags goes
// in one multiple ack: every tag up to its last one is finished, so the
// multiple flag covers nothing in flight. Finished tags behind a waiting
// requeue, a held delivery or an unconfirmed dead letter are acked one by
// one, because a multiple ack would swallow it and it may wait for
// seconds (a held one, for as long as the database is down; a dead letter,
// for as long as the broker blocks its connection). Finished tags behind a
// batch still in the database wait for it: it ends soon, and then one
// frame acks them all.
func (t *tracker) acks() []op {
	var ops []op
	n := 0
	for n < len(t.entries) && t.entries[n].state == ackable {
		n++
	}
	if n > 0 {
		settled := make([]decision, n)
		for i := range n {
			settled[i] = t.entries[i].d
		}
		ops = append(ops, op{verb: Ack, tag: t.entries[n-1].tag, multiple: n > 1, settled: settled})
		// The rest moves to the front: dropping the prefix instead would
		// make every add grow a new array.
		t.entries = t.entries[:copy(t.entries, t.entries[n:])]
	}
	if len(t.entries) == 0 || t.entries[0].state == processing {
		return ops
	}
	kept := t.entries[:0]
	for _, e := range t.entries {
		if e.state == ackable {
			ops = append(ops, op{verb: Ack, tag: e.tag, settled: []decision{e.d}})
			continue
		}
		kept = append(kept, e)
	}
	t.entries = kept
	return ops
}

func (t *tracker) remove(j int) {
	t.entries = append(t.entries[:j], t.entries[j+1:]...)
}
