package idemrabbitmq

import (
	"time"

	"github.com/idemkit/idem"
)

// Verb is what the consumer tells the broker about one delivery.
type Verb int

const (
	// Ack: basic.ack. The effect committed (Applied) or had committed before
	// (Duplicate); the broker may forget the message.
	Ack Verb = iota + 1
	// Requeue: basic.nack with requeue, after a backoff. The message was not
	// applied and will be delivered again.
	Requeue
	// DeadLetter: basic.reject without requeue, so the queue's dead-letter
	// exchange receives it; or, with [Config.DeadLetterExchange], a confirmed
	// republish carrying x-idem-reason followed by basic.ack.
	DeadLetter
)

// hold is the consumer's own verb for a Retry that is not the message's
// fault (see notItsFault): no frame is sent, the delivery stays unacked and
// is processed again in this session after a backoff. Quorum queues count
// every requeue towards their delivery limit, so holding is the only way an
// outage does not spend the messages' budget. It never reaches [Hooks].
const hold Verb = -1

// String returns the lower-case name used in logs and metric labels.
func (v Verb) String() string {
	switch v {
	case Ack:
		return "ack"
	case Requeue:
		return "requeue"
	case DeadLetter:
		return "dead_letter"
	}
	return "unknown"
}

// VerbFor maps a processor outcome to the broker verb. It is the only place
// in the package that makes this decision.
//
//   - Applied, Duplicate → Ack (only after the commit: the processor returns
//     them only then)
//   - Retry → Requeue after a backoff; never acked, so a commit whose outcome
//     is unknown is redelivered and settled by the inbox
//   - DeadLettered, Expired → DeadLetter, never acked as applied and never
//     requeued, so a poison message cannot loop
//   - anything else → Requeue: when in doubt, let the broker keep it
func VerbFor(o idem.Outcome) Verb {
	switch {
	case o.Acked():
		return Ack
	case o == idem.DeadLettered, o == idem.Expired:
		return DeadLetter
	}
	return Requeue
}

// tagState is where one delivery tag of the current channel stands.
type tagState int8

const (
	processing tagState = iota // in a batch, in the database
	ackable                    // finished; may be acked
	waiting                    // Retry; to be nacked with requeue when due
	held                       // Retry not the message's fault; to be processed again
)

// decision is what the consumer decided about one delivery. It is made
// once per result, from [VerbFor] and the consumer's own rules, and carried
// to the frame and to the hooks unchanged.
type decision struct {
	// frame is what to send the broker.
	frame Verb
	// verb is what happened to the message, for stats and hooks. It differs
	// from frame for a dead letter the consumer republished itself: the
	// frame is then an Ack of the original.
	verb Verb
	res  idem.Result
	// report: the consumer decided this outcome itself (a dead letter after
	// MaxAttempts), so it logs and counts it through the processor once the
	// frame reached the broker.
	report bool
}

// decide is the decision for a result before any republishing: the frame
// and the verb are both [VerbFor] of its outcome.
func decide(res idem.Result) decision {
	v := VerbFor(res.Outcome)
	return decision{frame: v, verb: v, res: res}
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
	verb     Verb
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

// finish records a batch's decisions, one per tag. It returns the frames to
// send now: the dead letters (rejected one by one: a rejected delivery must
// not wait behind others) and the acks that became possible. Requeues wait
// until due; see [tracker.due].
func (t *tracker) finish(tags []uint64, ds []decision, requeueAt time.Time) []op {
	var ops []op
	for i, tag := range tags {
		j := t.find(tag)
		if j < 0 {
			continue
		}
		t.entries[j].d = ds[i]
		switch ds[i].frame {
		case Ack:
			t.entries[j].state = ackable
		case Requeue:
			t.entries[j].state, t.entries[j].due = waiting, requeueAt
			t.nWaiting++
		case hold:
			t.entries[j].state = held
		default:
			ops = append(ops, op{verb: DeadLetter, tag: tag, settled: []decision{ds[i]}})
			t.remove(j)
		}
	}
	return append(ops, t.acks()...)
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
			t.entries[j].state = processing
		}
	}
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
// requeue or a held delivery are acked one by one, because a multiple ack
// would swallow it and it may wait for seconds (a held one, for as long as
// the database is down). Finished tags behind a batch
// still in the database wait for it: it ends soon, and then one frame acks
// them all.
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
		t.entries = t.entries[n:]
	}
	if len(t.entries) == 0 || (t.entries[0].state != waiting && t.entries[0].state != held) {
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
