// Package dlq is what an operator does with dead letters: list them grouped
// by reason and consumer, show one with what a redrive would do to it,
// redrive or purge a selection, and replay a message whose marker exists by
// retiring the marker, on purpose and with an audit row, first.
//
// The sources are a RabbitMQ dead-letter queue ([RabbitMQ]), a Kafka
// dead-letter topic ([Kafka]), a NATS JetStream dead-letter stream ([NATS])
// and a Redis dead-letter stream ([Redis]), as idemrabbitmq, idemkafka,
// idemnats and idemredis fill them. The
// verdict of a redrive is the consumer's own decision: its processor
// predicts what a delivery would do (idem.Processor.Predict), with the
// settings and pruned-key summaries read again before a letter is shown
// and before it is sent ([Inbox.Judge]).
//
// Every function returns structs and prints nothing, so a command line and a
// web console can share it. Redrive, purge and replay are dry runs unless
// [Selection.Apply] is set. A letter leaves its dead-letter queue only after
// the broker confirmed its republish (RabbitMQ: publisher confirm, then the
// dead-letter copy is acked; Kafka: acks=all, then the dead-letter group's
// offset is committed; JetStream: the PubAck, then the letter is deleted
// by its sequence): a failure in between leaves one copy in each place,
// and the consumer's inbox absorbs the second. A replay retires a marker
// at most once per consumer and key in a run (later copies of the message
// are redriven plainly), retires only the marker it judged, in the
// transaction that checks no replay of the same message wrote it (so two
// replays of one letter at once apply it once more, not twice), and puts
// a marker back when its republish failed. Nothing is ever lost.
package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemstore"
)

// Letter is one dead letter, as read from its dead-letter queue or topic.
type Letter struct {
	// ID is the message ID (AMQP message_id or the ID header; for Kafka the
	// ID header).
	ID string `json:"id"`
	// DLQ is the queue or topic the letter is in.
	DLQ string `json:"dlq"`
	// Position is where in the DLQ: the n-th message of the queue
	// (RabbitMQ, as read now), or partition/offset (Kafka).
	Position string `json:"position"`
	// Reason, Outcome, Consumer and Attempts are the x-idem-* headers. A
	// message the broker dead-lettered itself (RabbitMQ's delivery limit)
	// has none: Reason is then taken from x-first-death-reason.
	Reason   string `json:"reason"`
	Outcome  string `json:"outcome,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	Attempts int    `json:"attempts"`
	// Origin is the x-idem-origin header: the queue, or topic/partition/offset.
	Origin string `json:"origin"`
	// Target is where a redrive sends it: the origin queue or topic.
	Target string `json:"target"`
	// Redriven is how many times it was redriven before.
	Redriven int `json:"redriven"`
	// Time is the message's event time, from the most stable source it has
	// ([idem.EventTime]); zero when it has none.
	Time       time.Time       `json:"time,omitzero"`
	TimeSource idem.TimeSource `json:"-"`
	// TimeFrom names TimeSource: id, header, broker or none.
	TimeFrom string `json:"time_from"`
	// Key is the routing or record key (not the inbox key).
	Key     string            `json:"key,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"body,omitempty"`
}

// message is the letter as the consumer will see it when redriven.
func (l *Letter) message() idem.Message {
	return idem.Message{ID: l.ID, Source: l.Target, Key: l.Key, Headers: l.Headers, Body: l.Body, Time: l.Time, TimeSource: l.TimeSource}
}

// Action is what a [Source] does with one letter it walks.
type Action int

const (
	// Keep leaves the letter in the DLQ.
	Keep Action = iota
	// Send republishes it to its target and removes it once the broker
	// confirmed the republish.
	Send
	// Drop removes it.
	Drop
)

// Source is a dead-letter queue or topic.
type Source interface {
	// Name says which DLQ, for reports ("rabbitmq queue billing.dlq").
	Name() string
	// Peek returns up to limit letters (0: all there are now), in order,
	// and leaves them where they are.
	Peek(ctx context.Context, limit int) ([]Letter, error)
	// Walk hands the letters there are now (at most limit; 0: all), in
	// order, to decide, and carries out its answers: a Send is removed
	// only after the broker confirmed its republish; a Drop is removed.
	// done is called for each Send the broker confirmed and each Drop
	// carried out, saying whether the letter left the DLQ: a letter can
	// stay (Kafka removes only a prefix, so one behind a kept letter
	// stays; an acknowledgement can fail), and a Send that stays is sent
	// again by a later redrive, which the inbox absorbs. A decide or
	// broker error stops the walk; the letters not yet removed stay.
	Walk(ctx context.Context, limit int, decide func(*Letter) (Action, error), done func(l *Letter, a Action, removed bool)) error
	// Close releases the source's connections.
	Close() error
}

// Verdict is what a redrive of a letter would do at its consumer, in an
// operator's words: the outcome its consumer's processor predicts
// ([Judgement.Outcome]), a late duplicate called Expire.
type Verdict string

const (
	// Apply: the processor would apply it (idem.Applied): the handler runs.
	Apply Verdict = "apply"
	// Duplicate: its key has a marker (idem.Duplicate); the consumer acks
	// it without running the handler (a replay retires the marker first).
	Duplicate Verdict = "duplicate"
	// Expire: the processor would expire it (idem.Expired: older than the
	// inbox's window, or a late duplicate it refuses), or would apply it
	// although a prune probably deleted its key's marker (a late
	// duplicate applied a second time).
	Expire Verdict = "expire"
	// Invalid: the processor would dead-letter it again (idem.DeadLettered:
	// no ID, no valid inbox key, no event time it requires).
	Invalid Verdict = "invalid"
	// Unknown: no inbox was given to judge with, or no consumer named.
	Unknown Verdict = "unknown"
)

// Judgement is a verdict with what it rests on.
type Judgement struct {
	Verdict Verdict `json:"verdict"`
	// Outcome is what the consumer's processor predicts (0 for Unknown).
	Outcome idem.Outcome `json:"-"`
	// Why in words: the marker found, the horizon crossed.
	Why string `json:"why"`
	// InboxKey is the key the consumer will claim.
	InboxKey string `json:"inbox_key,omitempty"`
	// Marker is the marker found, for Duplicate.
	Marker *idemstore.Marker `json:"marker,omitempty"`
	// PrunedOn is the day a prune probably deleted the key's marker.
	PrunedOn time.Time `json:"pruned_on,omitzero"`
}

// MarshalJSON writes the outcome by name.
func (j Judgement) MarshalJSON() ([]byte, error) {
	type plain Judgement
	var o string
	if j.Outcome != 0 {
		o = j.Outcome.String()
	}
	return json.Marshal(struct {
		plain
		Outcome string `json:"outcome,omitempty"`
	}{plain(j), o})
}

// Group is the letters of one reason and consumer.
type Group struct {
	// Reason is the letters' reason, their message IDs in it written <id>.
	Reason   string    `json:"reason"`
	Consumer string    `json:"consumer"`
	Count    int       `json:"count"`
	Oldest   time.Time `json:"oldest,omitzero"`
	Newest   time.Time `json:"newest,omitzero"`
	// Untimed counts the letters with no event time (not in Oldest/Newest).
	Untimed     int `json:"untimed"`
	MinAttempts int `json:"min_attempts"`
	MaxAttempts int `json:"max_attempts"`
	// IDs are the first few message IDs, for show.
	IDs []string `json:"ids"`
}

// groupIDs is how many IDs a group lists.
const groupIDs = 5

// Listing is the content of a DLQ, grouped.
type Listing struct {
	DLQ    string  `json:"dlq"`
	Total  int     `json:"total"`
	Groups []Group `json:"groups"`
	// Warnings say what an operator should know: letters held twice, or
	// deleted by the broker.
	Warnings []string `json:"warnings,omitempty"`
}

// List reads the DLQ (at most limit letters; 0: all) without changing it
// and groups the letters by reason and consumer, largest group first.
func List(ctx context.Context, src Source, limit int) (Listing, error) {
	ls, err := src.Peek(ctx, limit)
	if err != nil {
		return Listing{}, err
	}
	out := Summarize(src.Name(), ls)
	if w, ok := src.(interface{ Warnings() []string }); ok {
		out.Warnings = append(out.Warnings, w.Warnings()...)
	}
	return out, nil
}

// Summarize groups letters by reason and consumer.
func Summarize(dlq string, ls []Letter) Listing {
	type gk struct{ reason, consumer string }
	idx := map[gk]int{}
	out := Listing{DLQ: dlq, Total: len(ls), Groups: []Group{}}
	for i := range ls {
		l := &ls[i]
		reason := groupReason(l)
		k := gk{reason, l.Consumer}
		n, ok := idx[k]
		if !ok {
			n = len(out.Groups)
			idx[k] = n
			out.Groups = append(out.Groups, Group{Reason: reason, Consumer: l.Consumer, MinAttempts: l.Attempts, MaxAttempts: l.Attempts})
		}
		g := &out.Groups[n]
		g.Count++
		g.MinAttempts, g.MaxAttempts = min(g.MinAttempts, l.Attempts), max(g.MaxAttempts, l.Attempts)
		if l.Time.IsZero() {
			g.Untimed++
		} else {
			if g.Oldest.IsZero() || l.Time.Before(g.Oldest) {
				g.Oldest = l.Time
			}
			if l.Time.After(g.Newest) {
				g.Newest = l.Time
			}
		}
		if len(g.IDs) < groupIDs {
			g.IDs = append(g.IDs, l.ID)
		}
	}
	sort.SliceStable(out.Groups, func(i, j int) bool { return out.Groups[i].Count > out.Groups[j].Count })
	return out
}

// Shown is one letter with the verdict of its redrive.
type Shown struct {
	Letter    Letter    `json:"letter"`
	Judgement Judgement `json:"judgement"`
}

// ErrNotFound is returned by [Show] for an ID the DLQ does not hold.
var ErrNotFound = errors.New("no dead letter with that message ID")

// Show finds the letter with message ID id (the first, when there are
// several copies) and judges its redrive with in (nil: Unknown).
func Show(ctx context.Context, src Source, in *Inbox, id string) (Shown, error) {
	ls, err := src.Peek(ctx, 0)
	if err != nil {
		return Shown{}, err
	}
	for i := range ls {
		if ls[i].ID == id {
			j, err := in.Judge(ctx, &ls[i])
			return Shown{Letter: ls[i], Judgement: j}, err
		}
	}
	return Shown{}, fmt.Errorf("%w: %q in %s", ErrNotFound, id, src.Name())
}

// Filter selects letters. Empty fields select everything.
type Filter struct {
	// Reason selects letters whose reason, as a listing groups it (the
	// message ID written <id>), contains it.
	Reason string
	// Consumer selects letters of this consumer.
	Consumer string
	// Since and Until bound the event time (a letter without one is
	// selected only when both are zero).
	Since, Until time.Time
	// IDs selects these message IDs.
	IDs []string
}

// groupReason is the reason of l as a listing groups it: its message ID,
// where it stands as a word of its own, written <id> ("handling message
// inv-1: ..." and "handling message inv-2: ..." are one reason).
func groupReason(l *Letter) string {
	if l.ID == "" {
		return l.Reason
	}
	word := func(b byte) bool {
		return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-' || b == '_' || b >= 0x80
	}
	var b strings.Builder
	s := l.Reason
	for {
		i := strings.Index(s, l.ID)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len(l.ID)
		whole := (i == 0 || !word(s[i-1]) || !word(l.ID[0])) && (end == len(s) || !word(s[end]) || !word(l.ID[len(l.ID)-1]))
		b.WriteString(s[:i])
		if whole {
			b.WriteString("<id>")
		} else {
			b.WriteString(l.ID)
		}
		s = s[end:]
	}
}

// Match reports whether f selects l. Reason is looked for in the reason as
// a listing shows it (message IDs written <id>), so it selects what the
// listing's groups say, not letters whose IDs contain the word.
func (f *Filter) Match(l *Letter) bool {
	if f.Reason != "" && !strings.Contains(groupReason(l), f.Reason) {
		return false
	}
	if f.Consumer != "" && l.Consumer != f.Consumer {
		return false
	}
	if !f.Since.IsZero() || !f.Until.IsZero() {
		if l.Time.IsZero() {
			return false
		}
		if !f.Since.IsZero() && l.Time.Before(f.Since) {
			return false
		}
		if !f.Until.IsZero() && !l.Time.Before(f.Until) {
			return false
		}
	}
	if len(f.IDs) > 0 && !slices.Contains(f.IDs, l.ID) {
		return false
	}
	return true
}

// Selection is what a redrive, purge or replay acts on, and how.
type Selection struct {
	Filter
	// Apply carries it out; without it, the result says what would be done
	// and nothing changes.
	Apply bool
	// Rate bounds the republishes per second (0: no bound).
	Rate float64
	// Expired redrives letters that the horizon expires: the consumer
	// expires them again unless its horizon applies expired messages
	// (idem.Horizon.ApplyExpired). Off: they are refused and stay.
	Expired bool
	// Invalid redrives letters without an ID or a valid key, which the
	// consumer dead-letters again (after a key function was fixed). Off:
	// they are refused and stay.
	Invalid bool
	// Limit bounds the letters read (0: all there are now).
	Limit int
	// Progress, when set, is called after each letter decided on.
	Progress func(done, matched int)
}

// Item is what happened, or would happen, to one letter.
type Item struct {
	ID        string    `json:"id"`
	Position  string    `json:"position"`
	Target    string    `json:"target"`
	Judgement Judgement `json:"judgement"`
	// Action: "redrive", "purge", "refuse" (left in the DLQ, see Why),
	// "replay" (marker retired, then redriven).
	Action string `json:"action"`
	// Done: the broker confirmed the republish (or the purge) and the
	// letter left the DLQ. False in a dry run.
	Done bool `json:"done"`
	// Sent: republished, and confirmed, even if the letter could not leave
	// the DLQ (Kafka, behind a kept letter).
	Sent bool   `json:"sent"`
	Why  string `json:"why,omitempty"`
	// Retired is the audit row of a replay's retired marker.
	Retired *Retired `json:"retired,omitempty"`
	// Restored is the audit row that put the marker back when the
	// republish failed after all.
	Restored *Retired `json:"restored,omitempty"`
}

// Result is the report of a redrive, purge or replay.
type Result struct {
	DLQ    string `json:"dlq"`
	DryRun bool   `json:"dry_run"`
	// Matched counts the letters the filter selected; Done those that left
	// the DLQ; Refused those left in it on purpose (expired, invalid).
	Matched  int      `json:"matched"`
	Done     int      `json:"done"`
	Refused  int      `json:"refused"`
	Items    []Item   `json:"items"`
	Warnings []string `json:"warnings,omitempty"`
}

// ByVerdict counts the items by verdict.
func (r *Result) ByVerdict() map[Verdict]int {
	m := map[Verdict]int{}
	for _, it := range r.Items {
		m[it.Judgement.Verdict]++
	}
	return m
}

// pacer spaces republishes rate per second apart.
type pacer struct {
	every time.Duration
	next  time.Time
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{every: time.Duration(float64(time.Second) / rate)}
}

func (p *pacer) wait(ctx context.Context) error {
	if p.every == 0 {
		return nil
	}
	now := time.Now()
	if d := p.next.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		now = p.next
	}
	p.next = now.Add(p.every)
	return nil
}

// Redrive sends the selected letters back to their origin. Duplicates are
// sent too (the consumer acks them without an effect, and they leave the
// DLQ); expired and invalid letters only when sel allows it, with a
// warning; otherwise they are refused and stay.
func Redrive(ctx context.Context, src Source, in *Inbox, sel Selection) (Result, error) {
	return walk(ctx, src, in, sel, "redrive", nil)
}

// Purge removes the selected letters for good. Without sel.Apply it only
// says which.
func Purge(ctx context.Context, src Source, in *Inbox, sel Selection) (Result, error) {
	return walk(ctx, src, in, sel, "purge", nil)
}

// Retirement is who retires a marker for a replay, and why; both are
// required and kept in the audit table.
type Retirement struct {
	By  string
	Why string
}

// Replay re-applies the selected letters whose keys have markers: for
// each, it retires the marker (moved to the audit table, never a silent
// delete) and redrives the letter, which the consumer then applies once
// more. Letters without a marker are redriven as [Redrive] would. The
// filter must name the IDs: a replay is a deliberate act on messages one
// knows.
func Replay(ctx context.Context, src Source, in *Inbox, sel Selection, r Retirement) (Result, error) {
	if len(sel.IDs) == 0 {
		return Result{}, errors.New("a replay names the message IDs it replays")
	}
	if strings.TrimSpace(r.By) == "" || strings.TrimSpace(r.Why) == "" {
		return Result{}, errors.New("a replay says who replays and why")
	}
	if in == nil {
		return Result{}, errors.New("a replay needs the inbox")
	}
	return walk(ctx, src, in, sel, "replay", &r)
}

// walker is one redrive, purge or replay over a source: the state a walk
// keeps between letters, and the steps that decide each one.
type walker struct {
	ctx  context.Context
	src  Source
	in   *Inbox
	sel  Selection
	op   string
	ret  *Retirement
	res  Result
	pace *pacer
	// byLetter: the index in res.Items of each letter handed back to the
	// source to send or drop, so that done can report how it ended.
	byLetter map[*Letter]int
	// replayed: the (consumer, key) pairs whose marker this replay retired
	// (or, in a dry run, would retire): a second copy of the message is
	// redriven plainly, and the consumer acks it as a duplicate of the
	// first.
	replayed map[[2]string]bool
	// read: when each consumer's settings and pruned-key summaries were
	// last read for this walk. Its first judgment reads them, and a send
	// is judged with them read at most freshFor before.
	read                         map[string]time.Time
	expiredWarned, invalidWarned bool
}

// step is what a walk does with one letter: the item it reports, the
// action it hands the source, whether a replay retires the letter's marker
// first (retire) and records its (consumer, key) as replayed (mark), and
// the warning it calls for ("expired", "invalid" or none).
type step struct {
	it     Item
	act    Action
	retire bool
	mark   bool
	warn   string
}

func walk(ctx context.Context, src Source, in *Inbox, sel Selection, op string, ret *Retirement) (Result, error) {
	w := &walker{
		ctx: ctx, src: src, in: in, sel: sel, op: op, ret: ret,
		res:      Result{DLQ: src.Name(), DryRun: !sel.Apply, Items: []Item{}},
		pace:     newPacer(sel.Rate),
		byLetter: map[*Letter]int{},
		replayed: map[[2]string]bool{},
		read:     map[string]time.Time{},
	}
	err := src.Walk(ctx, sel.Limit, w.decide, w.done)
	if err != nil {
		err = w.restoreUnsent(err)
	}
	return w.res, err
}

// consumerOf is the consumer whose inbox judges l: the one the letter
// names, else the inbox's own.
func (w *walker) consumerOf(l *Letter) string {
	if l.Consumer == "" && w.in != nil {
		return w.in.cfg.Consumer
	}
	return l.Consumer
}

// judge judges l, reading its consumer's settings and summaries again when
// this walk has not read them yet or read them more than freshFor ago.
func (w *walker) judge(l *Letter) (Judgement, error) {
	c := w.consumerOf(l)
	at, ok := w.read[c]
	fresh := !ok || time.Since(at) > freshFor
	if fresh {
		w.read[c] = time.Now()
	}
	return w.in.judgeLetter(w.ctx, l, fresh)
}

// judgeAndClassify judges l and decides its step under that judgement.
func (w *walker) judgeAndClassify(l *Letter) (step, Judgement, error) {
	j, err := w.judge(l)
	if err != nil {
		return step{act: Keep}, j, err
	}
	s, err := w.classify(l, j)
	return s, j, err
}

// classify decides the step for l under its judgement j: a purge drops
// every letter; a letter that cannot or may not be sent is kept (refused,
// with why); everything else is sent, and for a replay the duplicates'
// markers are retired first.
func (w *walker) classify(l *Letter, j Judgement) (step, error) {
	s := step{
		it:  Item{ID: l.ID, Position: l.Position, Target: l.Target, Judgement: j, Action: w.op},
		act: Send,
	}
	if w.op == "purge" {
		s.act = Drop
		return s, nil
	}
	if why := w.refusal(l, j); why != "" {
		s.it.Action, s.it.Why, s.act = "refuse", why, Keep
		return s, nil
	}
	switch j.Verdict {
	case Expire:
		s.warn = "expired"
		return s, nil
	case Invalid:
		s.warn = "invalid"
		return s, nil
	}
	return s, w.classifyKeyed(&s, l, j)
}

// refusal says why l is not sent under j, or "" when it may be: it names
// no origin, its verdict is unknown, or it is expired or invalid and the
// selection does not allow those.
func (w *walker) refusal(l *Letter, j Judgement) string {
	switch {
	case l.Target == "":
		return "the letter names no origin to redrive to"
	case j.Verdict == Unknown && w.in != nil:
		return "unknown: " + j.Why + "; without a verdict it is not sent (name the consumer of letters that name none)"
	case j.Verdict == Expire && !w.sel.Expired:
		return "expired: " + j.Why + "; redrive it with the expired flag to send it anyway (the consumer expires it again unless its horizon applies expired messages)"
	case j.Verdict == Invalid && !w.sel.Invalid:
		return "invalid: " + j.Why + "; the consumer would dead-letter it again"
	}
	return ""
}

// classifyKeyed completes s for a letter that is sent and neither expired
// nor invalid: within a replay, one copy per (consumer, key) retires the
// marker and later copies are sent plainly as its duplicates; a copy a
// replay already applied is refused.
func (w *walker) classifyKeyed(s *step, l *Letter, j Judgement) error {
	consumer := w.consumerOf(l)
	switch {
	case w.op == "replay" && w.replayed[[2]string{consumer, j.InboxKey}]:
		s.it.Action = "redrive"
		s.it.Why = "another copy of a message this replay replays: redriven without retiring anything, so the consumer applies the message once (the first copy) and acks this one as a duplicate"
	case j.Verdict == Duplicate && w.op == "replay":
		prior, err := w.in.replayedBefore(w.ctx, consumer, j.InboxKey, l.ID, j.Marker)
		if err != nil {
			*s = step{it: s.it, act: Keep}
			return err
		}
		if prior != nil {
			s.it.Action, s.act = "refuse", Keep
			s.it.Why = fmt.Sprintf("already replayed: audit row %d retired the marker of key %q for a replay of %q on %s (by %s), and the marker there now was written after it, by that replay: this letter is a copy left in the DLQ; redrive or purge it (to apply the message yet again, retire the marker on purpose first)",
				prior.ID, j.InboxKey, l.ID, prior.RetiredAt.UTC().Format(time.RFC3339), prior.RetiredBy)
			return nil
		}
		s.retire, s.mark = true, true
		s.it.Why = "marker retired to the audit table, then redriven: the consumer applies it once more"
	case j.Verdict == Duplicate:
		s.it.Why = "its key has a marker: the consumer acks it as a duplicate without an effect (replay it to apply it once more)"
	case w.op == "replay" && j.InboxKey != "":
		// Applied by the first copy redriven; later copies are its
		// duplicates.
		s.mark = true
	}
	return nil
}

// decide is the source's decision for one letter: Keep for a letter the
// selection does not match or the walk refuses, or in a dry run; Send or
// Drop otherwise, after pacing, a fresh judgment when the pace held it,
// and, for a replay, the marker retired. Every matched letter gets one
// item.
func (w *walker) decide(l *Letter) (Action, error) {
	if !w.sel.Match(l) {
		return Keep, nil
	}
	w.res.Matched++
	s, j, err := w.judgeAndClassify(l)
	if err != nil {
		return Keep, err
	}
	if s.act == Send && w.sel.Apply {
		if s, j, err = w.paced(l, s, j); err != nil {
			return Keep, err
		}
	}
	if s.mark {
		w.replayed[[2]string{w.consumerOf(l), j.InboxKey}] = true
	}
	w.warnOnce(s.warn)
	if s.act == Send && w.sel.Apply && s.retire {
		if err := w.retire(l, j, &s); err != nil {
			return Keep, err
		}
	}
	return w.record(l, s), nil
}

// paced waits for the rate limit before l is sent; if the wait outlasted
// freshFor, l is judged and classified again on settings and summaries
// read now, right before it is sent.
func (w *walker) paced(l *Letter, s step, j Judgement) (step, Judgement, error) {
	if err := w.pace.wait(w.ctx); err != nil {
		return s, j, err
	}
	if time.Since(w.read[w.consumerOf(l)]) <= freshFor {
		return s, j, nil
	}
	return w.judgeAndClassify(l)
}

// warnOnce adds the result's warning for redriving expired or invalid
// letters, once per walk each.
func (w *walker) warnOnce(warn string) {
	switch {
	case warn == "expired" && !w.expiredWarned:
		w.expiredWarned = true
		w.res.Warnings = append(w.res.Warnings, "redriving expired messages: they are older than the inbox window, so their markers may be gone and the consumer cannot prove them new; it expires them again unless its horizon applies expired messages (idem.Horizon.ApplyExpired)")
	case warn == "invalid" && !w.invalidWarned:
		w.invalidWarned = true
		w.res.Warnings = append(w.res.Warnings, "redriving messages without a valid ID or key: the consumer dead-letters them again unless its key function changed")
	}
}

// retire retires the marker l's judgement j saw, for a replay about to
// send it. If the marker changed since (another replay got there first,
// or the marker is now a replay's own effect), l is refused instead:
// sending it would apply the message once more than asked.
func (w *walker) retire(l *Letter, j Judgement, s *step) error {
	r, err := w.in.retireJudged(w.ctx, w.consumerOf(l), j.InboxKey, l.ID, j.Marker, *w.ret)
	switch {
	case errors.Is(err, ErrMarkerChanged):
		delete(w.replayed, [2]string{w.consumerOf(l), j.InboxKey})
		s.it.Action, s.act = "refuse", Keep
		s.it.Why = "not replayed: " + err.Error() + " (another replay of it, running at the same time, retired the marker first, or a replay of it wrote the marker there now): this letter is a copy; redrive or purge it"
	case err != nil:
		return fmt.Errorf("retiring the marker of %q: %w", l.ID, err)
	default:
		s.it.Retired = &r
	}
	return nil
}

// record adds s's item to the result and returns the action handed to the
// source: Keep for a refused letter or in a dry run (counted as refused
// when kept on purpose), else s's action, remembered for done.
func (w *walker) record(l *Letter, s step) Action {
	if s.act == Keep {
		w.res.Refused++
	}
	act := s.act
	if act == Keep || !w.sel.Apply {
		act = Keep
	} else {
		w.byLetter[l] = len(w.res.Items)
	}
	w.res.Items = append(w.res.Items, s.it)
	if w.sel.Progress != nil {
		// Here, not once the letter left: Kafka settles only when the
		// walk ends.
		w.sel.Progress(len(w.res.Items), w.res.Matched)
	}
	return act
}

// done records how a letter handed back to send or drop ended: removed
// from the DLQ (Done), or sent and still there, or still there.
func (w *walker) done(l *Letter, a Action, removed bool) {
	i, ok := w.byLetter[l]
	if !ok {
		return
	}
	it := &w.res.Items[i]
	it.Sent = a == Send
	it.Done = removed
	switch {
	case removed:
		w.res.Done++
	case a == Send && it.Retired != nil:
		it.Why = strings.TrimPrefix(it.Why+"; ", "; ") + "sent, but still in the DLQ (behind a letter that stays, or its removal failed): a later replay of it is refused, as its marker is this replay's; redrive or purge it"
	case a == Send:
		it.Why = strings.TrimPrefix(it.Why+"; ", "; ") + "sent, but still in the DLQ (behind a letter that stays, or its removal failed): a later redrive sends it again, which the inbox absorbs"
	default:
		it.Why = strings.TrimPrefix(it.Why+"; ", "; ") + "still in the DLQ (behind a letter that stays, or its removal failed)"
	}
}

// restoreUnsent puts back each marker retired for a republish that did
// not happen, after the walk failed with err: the key stays guarded, and
// the audit table says so. It returns err joined with any marker that
// stays retired.
func (w *walker) restoreUnsent(err error) error {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), restoreTimeout)
	defer cancel()
	for i := range w.res.Items {
		it := &w.res.Items[i]
		if it.Retired == nil || it.Sent {
			continue
		}
		r, ok, rerr := w.in.restore(bctx, it.Retired.ID, *w.ret, "the replay's republish failed: "+err.Error())
		switch {
		case rerr != nil:
			err = errors.Join(err, fmt.Errorf("the marker of %q stays retired (audit row %d): %w", it.ID, it.Retired.ID, rerr))
		case ok:
			it.Restored = &r
			it.Why = strings.TrimPrefix(it.Why+"; ", "; ") + fmt.Sprintf("not sent: its marker was put back (audit row %d)", r.ID)
		default:
			it.Why = strings.TrimPrefix(it.Why+"; ", "; ") + "not confirmed, and the key has a marker again: the republish may have gone through and been applied"
		}
	}
	return err
}

// freshFor is how long a walk judges with a consumer's settings and
// pruned-key summaries before it reads them again: a letter about to be
// sent is judged on a read at most this old.
const freshFor = time.Second

// restoreTimeout bounds putting markers back after a failed replay, which
// runs even when the replay was interrupted.
const restoreTimeout = 30 * time.Second

// deadLetterHeader reports whether a header is one a dead-lettering added,
// which a redrive removes.
func deadLetterHeader(k string) bool {
	switch k {
	case idembroker.HeaderReason, idembroker.HeaderOutcome, idembroker.HeaderConsumer, idembroker.HeaderAttempts, idembroker.HeaderOrigin, idembroker.HeaderRedriven,
		"x-death", "x-first-death-reason", "x-first-death-queue", "x-first-death-exchange",
		"x-last-death-reason", "x-last-death-queue", "x-last-death-exchange", "x-delivery-count":
		return true
	}
	return false
}
