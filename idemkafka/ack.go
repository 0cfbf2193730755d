package idemkafka

import "github.com/idemkit/idem"

// verb is what the consumer does on the broker side with one record.
type verb int8

const (
	// commit: the effect is durable (or was already): the offset may move
	// past the record.
	commit verb = iota + 1
	// deadLetter: produce the record to its dead-letter topic, wait until
	// all in-sync replicas have it, then move the offset past it.
	deadLetter
	// retry: commit nothing past the record; pause its partition (only
	// that one), wait the disposition's delay and run the record again,
	// alone. A rebalance or a shutdown ends the wait: the record is then
	// left to whoever owns the partition next.
	retry
)

var verbNames = [...]string{"", "commit", "dead_letter", "retry"}

func (v verb) String() string {
	if v < commit || v > retry {
		return "unknown"
	}
	return verbNames[v]
}

// verbFor is the one table from the core's disposition to Kafka's verbs.
// It decides nothing: the processor ([idem.Processor.Dispose]) has decided
// already whether a record is done, retried (and whether that try counted)
// or dead-lettered. Kafka has no per-record redelivery, so a Redeliver and
// a Hold both become a retry in place; they differ only in what the
// processor counted. An action this table does not know is a retry: it
// loses nothing.
func verbFor(d idem.Disposition) verb {
	switch d.Action {
	case idem.ActionAck:
		return commit
	case idem.ActionDeadLetter:
		return deadLetter
	default: // ActionRedeliver, ActionHold
		return retry
	}
}
