// Package reconcile finds the messages a consumer acknowledged but never
// applied, and redelivers them.
//
// An inbox proves that nothing is applied twice; it cannot prove that
// nothing is missing. A database that fails over to a lagging replica, a
// restored backup, or a broker that acknowledged before it synced can lose
// an effect whose message was acknowledged (docs/design.md, contract 17).
// [Check] compares a source of truth — the producer's outbox ([Outbox]), a
// Kafka topic ([Kafka]) or a list of IDs ([IDFile]) — with the consumer's
// inbox, and [Repair] sends exactly the missing messages to the consumer's
// own queue or topic, where its inbox applies each once.
//
// Every candidate is judged by the consumer's own processor
// (idem.Processor.PredictBatch), never by SQL of its own (contract 16): a
// marker present under the message's key is applied, even when another
// message ID won the key (a business key); a message older than the
// retention window is "beyond the window", never missing; a key among the
// pruned-key summaries is "probably applied".
package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
)

// Range bounds the candidates by event time: From <= time < To. A zero
// From means from the start of the source, a zero To up to its end.
// Candidates without an event time are always in range.
type Range struct {
	From, To time.Time
}

// Contains reports whether t is in the range; a zero t is.
func (r Range) Contains(t time.Time) bool {
	if t.IsZero() {
		return true
	}
	return (r.From.IsZero() || !t.Before(r.From)) && (r.To.IsZero() || t.Before(r.To))
}

// Candidate is one message a source says the consumer should have applied.
type Candidate struct {
	// Message is the message as the consumer receives it: its ID, event
	// time, headers and body, which its key function reads.
	Message idem.Message
	// Position says where in the source it is ("seq 42", "events/0@17",
	// "line 3").
	Position string
	// Record is its payload, to redeliver; nil when the source has none
	// (an ID file).
	Record *outbox.Record
}

// Source is a source of truth: what the consumer should have received.
type Source interface {
	// Name says which source, for reports ("outbox idem_outbox").
	Name() string
	// Read calls page with the candidates in r, a page at a time, in the
	// source's order; an error from page stops the read and is returned.
	Read(ctx context.Context, r Range, page func([]Candidate) error) error
	// Payloads reports whether the candidates carry their payload
	// (Candidate.Record), so that [Repair] can redeliver them.
	Payloads() bool
}

// Judge is the consumer's processor (*idem.Processor has these methods):
// it says what a delivery of each message would do, without running the
// handler.
type Judge interface {
	// Consumer names the consumer.
	Consumer() string
	// PredictBatch is idem.Processor.PredictBatch.
	PredictBatch(ctx context.Context, msgs []idem.Message) ([]idem.Result, error)
	// Refresh is idem.Processor.Refresh: the stored settings and pruned-key
	// summaries are read again now.
	Refresh(ctx context.Context) error
}

// Status is the verdict on one candidate.
type Status int

const (
	// Applied: the consumer holds the marker of the message's key, written
	// by this message.
	Applied Status = iota
	// AppliedAs: the key's marker was written by another message ID (a
	// business key folds both into one effect): not missing.
	AppliedAs
	// Missing: no marker for the key: a delivery now would apply it. The
	// message was acknowledged (or never arrived) without its effect.
	Missing
	// ProbablyApplied: no marker, but the key is among the keys a prune
	// deleted (the pruned-key summaries): it was applied and pruned.
	ProbablyApplied
	// BeyondWindow: the message is older than the inbox's retention
	// window: its marker may have been pruned, so nothing can be said.
	BeyondWindow
	// Invalid: the consumer would refuse the message (no ID, a key its
	// key function cannot derive, untimed and refused): it went to the
	// dead-letter path, not missing here.
	Invalid
)

var statusNames = [...]string{"applied", "applied_as", "missing", "probably_applied", "beyond_window", "invalid"}

// String is the status's name in reports and JSON.
func (s Status) String() string {
	if s < 0 || int(s) >= len(statusNames) {
		return "unknown"
	}
	return statusNames[s]
}

// MarshalText writes the status's name.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Finding is a candidate that was not plainly applied.
type Finding struct {
	ID       string    `json:"id"`
	Time     time.Time `json:"time,omitzero"`
	Key      string    `json:"key,omitempty"`
	Position string    `json:"position"`
	Status   Status    `json:"status"`
	// By is the message ID that holds the key's marker (AppliedAs).
	By string `json:"by,omitempty"`
	// Why says more: the consumer's error (Invalid, BeyondWindow), the
	// day the key was pruned (ProbablyApplied).
	Why string `json:"why,omitempty"`
	// Record is the payload to redeliver; nil when the source has none.
	Record *outbox.Record `json:"-"`
}

// Report is the result of [Check].
type Report struct {
	Consumer string    `json:"consumer"`
	Source   string    `json:"source"`
	From     time.Time `json:"from,omitzero"`
	To       time.Time `json:"to,omitzero"`
	At       time.Time `json:"at"`
	// Checked counts the candidates judged.
	Checked int `json:"checked"`
	// Counts has the candidates by status.
	Counts map[Status]int `json:"counts"`
	// Missing lists the missing messages, in the source's order.
	Missing []Finding `json:"missing"`
	// Other lists the candidates neither applied nor missing: applied
	// under another ID, probably applied, beyond the window, invalid.
	Other []Finding `json:"other"`
	// Payloads says whether the findings carry what Repair redelivers.
	Payloads bool `json:"-"`
}

// MarshalJSON writes Counts by status name.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	counts := map[string]int{}
	for s := Applied; s <= Invalid; s++ {
		counts[s.String()] = r.Counts[s]
	}
	return json.Marshal(struct {
		plain
		Counts map[string]int `json:"counts"`
	}{plain(r), counts})
}

// batchSize bounds the messages judged in one lookup.
const batchSize = 1000

// Check judges every candidate of src in r with the consumer's processor
// and reports what is missing. The processor's settings and pruned-key
// summaries are read again first. Reading writes nothing: neither the
// inbox nor the source changes (contract 15).
func Check(ctx context.Context, src Source, judge Judge, r Range) (Report, error) {
	if src == nil || judge == nil {
		return Report{}, errors.New("reconcile: a source and a judge are required")
	}
	rep := Report{Consumer: judge.Consumer(), Source: src.Name(), From: r.From, To: r.To, At: time.Now().UTC(),
		Counts: map[Status]int{}, Missing: []Finding{}, Other: []Finding{}, Payloads: src.Payloads()}
	if err := judge.Refresh(ctx); err != nil {
		return rep, fmt.Errorf("reconcile: reading the inbox settings of %s: %w", rep.Consumer, err)
	}
	judgePage := func(cs []Candidate) error {
		msgs := make([]idem.Message, len(cs))
		for i := range cs {
			msgs[i] = cs[i].Message
		}
		res, err := judge.PredictBatch(ctx, msgs)
		if err != nil {
			return fmt.Errorf("reconcile: judging with consumer %s: %w", rep.Consumer, err)
		}
		for i, c := range cs {
			f := verdict(c, res[i])
			rep.Checked++
			rep.Counts[f.Status]++
			switch f.Status {
			case Applied:
			case Missing:
				rep.Missing = append(rep.Missing, f)
			default:
				rep.Other = append(rep.Other, f)
			}
		}
		return nil
	}
	err := src.Read(ctx, r, func(cs []Candidate) error {
		for len(cs) > 0 {
			n := min(len(cs), batchSize)
			if err := judgePage(cs[:n]); err != nil {
				return err
			}
			cs = cs[n:]
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	return rep, nil
}

// verdict turns the processor's prediction for c into a finding.
func verdict(c Candidate, res idem.Result) Finding {
	m := c.Message
	f := Finding{ID: m.ID, Time: m.Time, Key: res.Key, Position: c.Position, Record: c.Record}
	switch res.Outcome {
	case idem.Duplicate:
		f.Status = Applied
		if res.First != nil && res.First.MessageID != m.ID {
			f.Status, f.By = AppliedAs, res.First.MessageID
		}
	case idem.Applied:
		f.Status = Missing
		if !res.PrunedOn.IsZero() {
			f.Status = ProbablyApplied
			f.Why = "key pruned on " + res.PrunedOn.Format(time.DateOnly)
		}
	case idem.Expired:
		f.Status = BeyondWindow
		if errors.Is(res.Err, idem.ErrMarkerPruned) {
			// A consumer that refuses late duplicates refuses this one: its
			// key was pruned, so it was applied.
			f.Status = ProbablyApplied
			f.Why = "key pruned on " + res.PrunedOn.Format(time.DateOnly)
		} else if res.Err != nil {
			f.Why = res.Err.Error()
		}
	default:
		f.Status = Invalid
		if res.Err != nil {
			f.Why = res.Err.Error()
		}
	}
	return f
}
