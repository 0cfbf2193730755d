package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// Processor applies messages exactly once in effect: for each message it
// claims the message's key in the inbox and runs the handler in the same
// transaction, then commits. Adapters ack the broker only after Process or
// ProcessBatch returns an outcome for which [Outcome.Acked] is true.
// A Processor is safe for concurrent use.
type Processor[TTx any] struct {
	store idemstore.Store[TTx]
	cfg   Config[TTx]
	// userHorizon is Config.Horizon as the consumer set it; the guard in
	// force (p.horizon()) is derived from it and the stored settings.
	userHorizon Horizon
	inbox       inboxState
	// pause is what the processor last read of its consumer's pause.
	pause pauseState
	// spent remembers the attempts of messages given back to the broker
	// with their tries counted, so that the budget holds across deliveries.
	spent *attemptMemory
	// partitionTime places a key in a partitioned inbox; nil on the plain
	// layout.
	partitionTime func(key string) (time.Time, error)
	notes         notes
	hooks         []Hook
	// tracers are the TraceHooks among hooks; none costs a nil check.
	tracers []TraceHook
	// durabilityLogged is the summary of the durability risks logged last
	// (checkDurability), so that a Check repeated after an outage logs
	// them again only when they changed.
	durabilityLogged atomic.Pointer[string]
}

// NewProcessor returns a processor over store. It applies cfg's defaults and
// returns an error wrapping [ErrConfig] when cfg is invalid.
func NewProcessor[TTx any](store idemstore.Store[TTx], cfg *Config[TTx]) (*Processor[TTx], error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrConfig)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: config is nil", ErrConfig)
	}
	c := *cfg
	user := c.Horizon
	if c.Horizon.Window == 0 {
		// Until the stored settings are read (ready), which judge the
		// window, the consumer guards with the store's configured one.
		c.Horizon.Window = store.Window()
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	p := &Processor[TTx]{store: store, cfg: c, userHorizon: user, spent: newAttemptMemory(maxRememberedAttempts)}
	h := c.Horizon
	p.inbox.horizon.Store(&h)
	p.hooks = append(p.hooks, c.Hooks...)
	Each(p.hooks, func(t TraceHook) { p.tracers = append(p.tracers, t) })
	if store.Layout() == idemstore.LayoutPartitioned && !c.Natural {
		switch {
		case c.PartitionTime != nil:
			p.partitionTime = c.PartitionTime
		case sameFunc(c.Key, ByMessageID):
			p.partitionTime = partitionTimeFromUUIDv7
		default:
			return nil, fmt.Errorf("%w: consumer %s: a partitioned inbox needs a partition time that is a function of the key alone, and this consumer's key is not the message ID: set Config.PartitionTime (for invoice:<customer>:<period>, the period's start)", ErrConfig, c.Consumer)
		}
	}
	return p, nil
}

// Consumer returns the consumer name.
func (p *Processor[TTx]) Consumer() string { return p.cfg.Consumer }

// Natural reports whether the consumer was declared naturally idempotent (no
// marker is written; every delivery runs the handler).
func (p *Processor[TTx]) Natural() bool { return p.cfg.Natural }

// item is one message on its way through the processor.
type item struct {
	msg   Message
	claim idemstore.Claim
	res   Result
	// hash is the body's SHA-256, which claim.BodySHA256 points into: one
	// allocation fewer per message.
	hash  [sha256.Size]byte
	fresh bool // claimed by this transaction: the handler must run
	// skipped: not attempted, because a message before it in the batch
	// ended the walk; it is not reported and comes again.
	skipped bool
	// handlerFailed: its handler returned the error that failed the
	// transaction it was in.
	handlerFailed bool
	// exhausted: its budget ran out in the batch's shared try.
	exhausted bool
	// ctx carries the message's span, when a TraceHook started one.
	ctx context.Context
}

// within returns the context it is processed under: its own span's, or
// ctx when it has none.
func (it *item) within(ctx context.Context) context.Context {
	if it.ctx != nil {
		return it.ctx
	}
	return ctx
}

// Process applies one message in its own transaction, retrying transient
// failures per the retry policy, and returns its outcome.
func (p *Processor[TTx]) Process(ctx context.Context, msg Message) Result {
	if len(p.tracers) == 0 {
		return p.disposed(p.process(ctx, msg))
	}
	ctx, end := p.startMessage(ctx, msg)
	r := p.process(ctx, msg)
	end(r)
	return p.disposed(r)
}

// disposed is r with its disposition: the one decision an adapter carries
// out (docs/design.md 16).
func (p *Processor[TTx]) disposed(r Result) Result {
	r.Disposition = p.Dispose(r)
	return r
}

func (p *Processor[TTx]) process(ctx context.Context, msg Message) Result {
	start := time.Now()
	if err := p.readyWait(ctx); err != nil {
		r := notReadyResult(msg, err)
		p.report(r, time.Since(start))
		return r
	}
	it := p.prepare(msg)
	if it.res.Outcome == 0 {
		p.processOne(ctx, it, 0)
	}
	p.report(it.res, time.Since(start))
	return it.res
}

// ProcessBatch applies msgs in one transaction: their claims go in one
// statement in sorted key order, the handler runs for fresh keys in message
// order, and a key repeated inside the batch is applied once. If anything
// fails, the transaction rolls back and each message is processed on its own,
// so one poison message, or one that must be retried, cannot sink its
// neighbours. Results are in the order of msgs.
func (p *Processor[TTx]) ProcessBatch(ctx context.Context, msgs []Message) []Result {
	return p.batch(ctx, msgs, false)
}

// ProcessBatchInOrder is ProcessBatch for a stream whose order matters (a
// Kafka partition): when the batch falls back to one message at a time and a
// message ends in Retry, the messages after it are not tried and also get
// Retry, wrapping [ErrNotAttempted], so none is applied ahead of it.
// Dead-lettered messages do not stop the walk: they leave the stream.
func (p *Processor[TTx]) ProcessBatchInOrder(ctx context.Context, msgs []Message) []Result {
	return p.batch(ctx, msgs, true)
}

// ProcessTx claims msg's key and runs the handler inside tx, a transaction
// the caller owns and must commit whenever it returns a nil error: on
// Applied for the effect, and on Duplicate too, since a duplicate newer than
// its marker extends the marker's life in tx (docs/design.md 8). It writes
// nothing for a DeadLettered message. A non-nil error means
// the claim or the handler failed and tx must be rolled back; so does an
// Expired result with its error, a late duplicate refused after its claim
// (Config.RefuseLate), whose marker tx holds. The result is
// logged and observed when ProcessTx returns, before the caller commits: a
// caller that then rolls back has still been counted as Applied.
func (p *Processor[TTx]) ProcessTx(ctx context.Context, tx TTx, msg Message) (Result, error) {
	if len(p.tracers) == 0 {
		r, err := p.processTx(ctx, tx, msg)
		if err == nil {
			r = p.disposed(r)
		}
		return r, err
	}
	ctx, end := p.startMessage(ctx, msg)
	r, err := p.processTx(ctx, tx, msg)
	if err == nil {
		r = p.disposed(r)
	}
	if err != nil {
		// The caller rolls back: the message is not applied.
		traced := r
		traced.Err = err
		if traced.Outcome == 0 {
			traced.Outcome = Retry
		}
		end(traced)
	} else {
		end(r)
	}
	return r, err
}

func (p *Processor[TTx]) processTx(ctx context.Context, tx TTx, msg Message) (Result, error) {
	start := time.Now()
	// Read in tx: the caller may hold the pool's only connection.
	if err := p.readyIn(ctx, false, &tx); err != nil {
		return notReadyResult(msg, err), err
	}
	it := p.prepare(msg)
	if it.res.Outcome == 0 {
		it.res.Attempts = 1
		fresh := []*item{it}
		var err error
		if !p.cfg.Natural {
			if fresh, _, err = p.claimAndExtend(ctx, tx, fresh); err != nil {
				return it.res, err
			}
			if it.res.Outcome == Expired {
				// Refused as a late duplicate after its claim: the
				// marker is in the caller's transaction, which must be
				// rolled back, or its redeliveries would be Duplicates
				// of a message never applied.
				p.report(it.res, time.Since(start))
				return it.res, it.res.Err
			}
		}
		if err := p.handle(ctx, tx, fresh, false); err != nil {
			return it.res, err
		}
		for _, f := range fresh {
			f.res.Outcome = Applied
		}
	}
	p.report(it.res, time.Since(start))
	return it.res, nil
}

// prepare validates msg and computes its key. Bad input comes back with
// outcome DeadLettered, and a message too old to be proven new with Expired,
// before anything touches the database.
func (p *Processor[TTx]) prepare(msg Message) *item {
	it := new(item)
	p.prepareInto(it, msg)
	return it
}

// prepareInto is prepare into it, which a batch allocates with its
// neighbours in one slice.
func (p *Processor[TTx]) prepareInto(it *item, msg Message) {
	p.admit(it, msg, false)
}

// admit is prepareInto; quiet leaves out the logs of a message handled
// (a time ahead, an untimed message, an expired one applied), for Predict,
// which handles nothing.
func (p *Processor[TTx]) admit(it *item, msg Message, quiet bool) {
	*it = item{msg: msg, res: Result{MessageID: msg.ID}}
	if err := validID(msg.ID); err != nil {
		it.res.Outcome, it.res.Err = DeadLettered, err
		return
	}
	if msg.TimeErr != nil {
		it.res.Outcome, it.res.Err = DeadLettered, fmt.Errorf("%w: %w", ErrBadTime, msg.TimeErr)
		return
	}
	h := p.horizon()
	if h.ahead(it.msg.Time) {
		// A clock gone wrong: a marker kept until then would outlive every
		// prune, and the time says nothing about the message's age.
		if !quiet {
			p.notes.future(p.cfg.Logger, p.cfg.Consumer, msg.ID, msg.Time, h.MaxAhead)
		}
		it.msg.Time, it.msg.TimeSource = time.Time{}, TimeNone
	}
	it.res.TimeSource = it.msg.TimeSource
	if !p.cfg.Natural && it.msg.Time.IsZero() {
		it.res.Untimed = true
		if p.cfg.RefuseUntimed {
			it.res.Outcome, it.res.Err = DeadLettered, fmt.Errorf("%w (Config.RefuseUntimed)", ErrUntimed)
			return
		}
		if !quiet {
			p.notes.untimed(p.cfg.Logger, p.cfg.Consumer, msg.ID)
		}
	}
	if p.partitionTime == nil {
		if p.expired(it, h.check(it.msg), quiet) {
			return
		}
	}
	if p.cfg.Natural {
		return
	}
	key, err := p.key(it.msg)
	if err == nil {
		err = validKey(key)
	}
	if err != nil {
		it.res.Outcome, it.res.Err = DeadLettered, err
		return
	}
	it.res.Key = key
	it.hash = sha256.Sum256(msg.Body)
	it.claim = idemstore.Claim{Key: key, MessageID: msg.ID, BodySHA256: it.hash[:], EventTime: it.msg.Time}
	if p.partitionTime != nil {
		pt, err := p.placeKey(key)
		if err != nil {
			it.res.Outcome, it.res.Err = DeadLettered, err
			return
		}
		if pt.After(h.Now().Add(maxPartitionAhead)) {
			it.res.Outcome, it.res.Err = DeadLettered, fmt.Errorf("%w: key %q: partition time %s is more than %v ahead", ErrNoPartitionTime, key, pt.UTC().Format(time.RFC3339), maxPartitionAhead)
			return
		}
		it.claim.PartitionTime = pt
		if p.expired(it, h.checkPartition(pt), quiet) {
			return
		}
	}
	p.lateRefused(it)
}

// maxPartitionAhead is how far ahead a partition time may be: partitioned
// stores create their daily partitions a few days ahead (at least this).
const maxPartitionAhead = 24 * time.Hour

// expired makes it Expired when err says it is too old, unless expired
// messages are applied anyway (logged unless quiet), and reports whether
// it did.
func (p *Processor[TTx]) expired(it *item, err error, quiet bool) bool {
	if err == nil {
		return false
	}
	if !p.horizon().ApplyExpired {
		it.res.Outcome, it.res.Err = Expired, err
		return true
	}
	if quiet {
		return false
	}
	p.cfg.Logger.Warn("applying an expired message (Horizon.ApplyExpired)",
		"consumer", p.cfg.Consumer, "message_id", it.msg.ID, "error", err)
	return false
}

// placeKey returns key's partition time, or why it has none.
func (p *Processor[TTx]) placeKey(key string) (t time.Time, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: partition time func panicked on key %q: %v", ErrNoPartitionTime, key, r)
		}
	}()
	t, err = p.partitionTime(key)
	switch {
	case err != nil:
		return time.Time{}, fmt.Errorf("%w: key %q: %w", ErrNoPartitionTime, key, err)
	case t.IsZero():
		return time.Time{}, fmt.Errorf("%w: key %q: the partition time func returned no time", ErrNoPartitionTime, key)
	}
	return t.UTC(), nil
}

func (p *Processor[TTx]) key(msg Message) (key string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: key func panicked: %v", ErrBadKey, r)
		}
	}()
	key, err = p.cfg.Key(msg)
	if err != nil {
		return "", fmt.Errorf("%w: computing key: %w", ErrBadKey, err)
	}
	return key, nil
}

// processOne runs it in its own transaction until it succeeds or the retry
// policy gives up. prior counts the batch transactions it was already part
// of: they show in Result.Attempts but do not use up the retry budget, so a
// failing neighbour cannot cost a message its own retries. Nor does an
// unavailable database, for up to RetryPolicy.WaitUnavailable: the outage is
// not the message's fault.
func (p *Processor[TTx]) processOne(ctx context.Context, it *item, prior int) {
	r := p.retrier(p.cfg.Retry)
	r.attempt = p.spent.get(it.msg.ID)
	v, ok := p.attempt(ctx, []*item{it}, r, prior)
	if !ok {
		it.res.Outcome, it.res.Err, it.res.Blameless = v.outcome, v.err, v.blameless
	}
	switch {
	case it.res.Outcome != Retry:
		p.spent.forget(it.msg.ID) // final: applied, duplicate or dead-lettered
	case r.attempt > 0:
		// Counted tries are remembered, a blameless end (an outage, a
		// shutdown) included, so the budget survives both.
		p.spent.set(it.msg.ID, r.attempt)
	}
}

func (p *Processor[TTx]) retrier(policy RetryPolicy) *retrier {
	return &retrier{policy: policy, class: func(err error) idemstore.ErrorClass { return classify(p.store, err) }}
}

// attempt runs the transaction over items until it succeeds or r gives up,
// and then returns r's verdict. prior counts earlier transactions of these
// items, for Result.Attempts.
func (p *Processor[TTx]) attempt(ctx context.Context, items []*item, r *retrier, prior int) (verdict, bool) {
	for runs := 1; ; runs++ {
		if runs > 1 || prior > 0 {
			// Time has passed: the stored window may have been shortened
			// (read again, at most once a minute), and a message that fell
			// behind the horizon meanwhile may have lost its marker to
			// prune. A batch leaves that to its messages, tried one by one.
			_ = p.ready(ctx, false) // on failure the horizon read last stays
			if err := p.horizonPassed(items); err != nil {
				if len(items) == 1 {
					return verdict{outcome: Expired, err: err}, false
				}
				return verdict{outcome: Retry, err: err}, false
			}
		}
		for _, it := range items {
			it.res.Attempts = prior + runs
		}
		err := p.runTx(ctx, items)
		if err == nil {
			return verdict{}, true
		}
		v := r.next(ctx, err)
		p.attempted(ctx, items, runs, err, v)
		if !v.again {
			return v, false
		}
		t := time.NewTimer(v.wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return verdict{outcome: Retry, err: fmt.Errorf("%w (after: %w)", ctx.Err(), err), blameless: true, whole: true}, false
		case <-t.C:
		}
	}
}

// attempted reports a failed try, made under ctx, to the attempt and trace
// hooks.
func (p *Processor[TTx]) attempted(ctx context.Context, items []*item, try int, err error, v verdict) {
	if len(p.hooks) == 0 {
		return
	}
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.msg.ID
	}
	a := Attempt{MessageIDs: ids, Batch: len(items) > 1, Try: try, Class: classify(p.store, err), Err: err, Again: v.again, Wait: v.wait}
	Each(p.hooks, func(h AttemptHook) { h.OnAttempt(p.cfg.Consumer, a) })
	for _, t := range p.tracers {
		t.TraceAttempt(ctx, p.cfg.Consumer, a)
	}
}

// horizonPassed returns the error of the first of items that has fallen
// behind the horizon, unless expired messages are applied anyway.
func (p *Processor[TTx]) horizonPassed(items []*item) error {
	h := p.horizon()
	if h.ApplyExpired {
		return nil
	}
	for _, it := range items {
		err := h.check(it.msg)
		if p.partitionTime != nil {
			err = h.checkPartition(it.claim.PartitionTime)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// runTx is one transaction over items: claim, handle, commit. On success
// every item's outcome is Applied or Duplicate.
func (p *Processor[TTx]) runTx(ctx context.Context, items []*item) error {
	for _, it := range items {
		it.res.Outcome, it.res.Err, it.res.First, it.res.Conflict, it.res.Blameless, it.fresh, it.handlerFailed = 0, nil, nil, false, false, false, false
	}
	commitCtx := context.WithoutCancel(ctx)
	if p.cfg.TxTimeout > 0 {
		// Every statement of the transaction runs under this deadline: a
		// half-open connection fails the try instead of stalling it.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.TxTimeout)
		defer cancel()
	}
	tx, err := p.store.Begin(ctx)
	if err != nil {
		return wrapStep(stepBegin, err)
	}
	open := true
	defer func() {
		if open {
			_ = p.store.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	if err := p.fault(ctx, BeforeClaim, items); err != nil {
		return err
	}
	fresh, extended := items, false
	if !p.cfg.Natural {
		if fresh, extended, err = p.claimAndExtend(ctx, tx, items); err != nil {
			return err
		}
	}
	if err := p.fault(ctx, AfterClaim, items); err != nil {
		return err
	}
	if err := p.handle(ctx, tx, fresh, len(items) > 1); err != nil {
		// A connection closed because this transaction's own deadline
		// (TxTimeout) cut a slow handler short is the message's doing, and
		// so is one the driver closed when a deadline of the handler's own
		// fired (a query bounded by its own context); one the server or
		// the network closed is an outage.
		if ctx.Err() == nil && ownDeadline(err) {
			// The deadline fired on a slow query or on a database that
			// stopped answering: a store that can ping tells which. The
			// failed transaction goes back to the pool first: on a full
			// pool (one worker on a pool of one, N timing out together on
			// a pool of N) the ping would otherwise wait for the
			// connection its own caller holds, find no database, and hold
			// a poison message forever.
			open = false
			_ = p.store.Rollback(context.WithoutCancel(ctx), tx)
			if p.ping(ctx) != nil {
				return &connLostError{err}
			}
			return &handlerDeadlineError{err}
		}
		if !IsPermanent(err) && ctx.Err() == nil && p.store.Broken(tx) {
			return &connLostError{err}
		}
		return err
	}
	if err := p.fault(ctx, AfterHandler, items); err != nil {
		return err
	}
	recorded, err := p.recordPositions(ctx, tx, items)
	if err != nil {
		return err
	}
	if len(fresh) == 0 && !extended && !recorded && !p.needsCommit(tx) {
		return nil // all duplicates: nothing to commit, the deferred rollback ends it
	}
	// A consumer shutting down mid-commit is better served by a commit that
	// finishes than by one whose outcome is unknown; CommitTimeout still
	// bounds it.
	open = false
	if p.cfg.CommitTimeout > 0 {
		var cancel context.CancelFunc
		commitCtx, cancel = context.WithTimeout(commitCtx, p.cfg.CommitTimeout)
		defer cancel()
	}
	if err := p.store.Commit(commitCtx, tx); err != nil {
		if commitCtx.Err() != nil && !errors.Is(err, ErrCommitUnknown) {
			err = fmt.Errorf("%w: no answer within the commit timeout %v: %w", ErrCommitUnknown, p.cfg.CommitTimeout, err)
		}
		return wrapStep(stepCommit, err)
	}
	for _, it := range fresh {
		it.res.Outcome = Applied
	}
	if err := p.fault(ctx, AfterCommit, items); err != nil {
		for _, it := range fresh {
			it.res.Outcome = 0
		}
		return &afterCommitError{err}
	}
	return nil
}

// recordPositions records, in tx, the highest Message.Next of each source
// among items, and reports whether it wrote any: the transaction must then
// commit even when every message in it was a duplicate.
//
// The position vouches that every message of its source before it is
// settled (applied, a duplicate, or dead-lettered and left to the
// adapter, which acknowledges nothing past a dead letter before it is
// durable), and that this database holds what was applied. That holds
// because a position is written only in the transaction that settles its
// messages, and only in order:
//   - a transaction of several messages (a batch's shared try) commits
//     only when every one of them is Applied or a Duplicate; when anything
//     fails it rolls back, its position with it, and the batch falls back
//     to one message at a time;
//   - one message at a time, each transaction writes its own message's
//     position only; ProcessBatchInOrder stops the walk at the first
//     Retry, so no transaction after it runs, and no position past it is
//     written; the messages dead-lettered before it without a transaction
//     write none (the next settled message's position covers them);
//   - a message refused as a late duplicate after its claim (Expired)
//     writes none: its transaction must roll back;
//   - ProcessBatch clears Next (out of order a message after a Retry may
//     settle), and ProcessTx ignores it.
//
// A position may therefore lag what is settled, never lead it.
func (p *Processor[TTx]) recordPositions(ctx context.Context, tx TTx, items []*item) (bool, error) {
	var ps []idemstore.Position
	for _, it := range items {
		if it.msg.Next <= 0 {
			continue
		}
		if it.res.Outcome != 0 && it.res.Outcome != Duplicate {
			return false, nil // refused after its claim: nothing may commit
		}
		i := slices.IndexFunc(ps, func(q idemstore.Position) bool { return q.Source == it.msg.Source })
		switch {
		case i < 0:
			ps = append(ps, idemstore.Position{Source: it.msg.Source, Next: it.msg.Next})
		case it.msg.Next > ps[i].Next:
			ps[i].Next = it.msg.Next
		}
	}
	if len(ps) == 0 {
		return false, nil
	}
	if err := p.store.RecordPositions(ctx, tx, p.cfg.Consumer, ps); err != nil {
		return false, wrapStep(stepPositions, err)
	}
	return true, nil
}

// Positions returns the positions the consumer's transactions recorded
// (see [Message.Next]), one per source: how far the database can vouch
// that each source was settled.
func (p *Processor[TTx]) Positions(ctx context.Context) ([]idemstore.Position, error) {
	return p.store.Positions(ctx, p.cfg.Consumer)
}

// ForgetPositions deletes the consumer's recorded positions and returns
// how many it deleted: after a database deliberately reset, an adapter
// then trusts the broker's committed positions as they are.
func (p *Processor[TTx]) ForgetPositions(ctx context.Context) (int64, error) {
	return p.store.ForgetPositions(ctx, p.cfg.Consumer)
}

// claimAndExtend inserts the markers of items' distinct keys in sorted key
// order and returns, in message order, the items this transaction claimed.
// The others become Duplicates. A duplicate whose event time is later than
// what its marker is kept for extends the marker's life (docs/design.md 8), and
// extended says so: the transaction must then commit even when nothing was
// claimed. A plain redelivery carries the marker's own time and writes
// nothing.
func (p *Processor[TTx]) claimAndExtend(ctx context.Context, tx TTx, items []*item) (fresh []*item, extended bool, err error) {
	// owned holds the item that owns each distinct key, the first message
	// with it.
	owned := items
	if len(items) > 1 {
		owners := make(map[string]*item, len(items))
		owned = make([]*item, 0, len(items))
		for _, it := range items {
			if owner, ok := owners[it.claim.Key]; ok {
				// The same key twice in one batch: the first message owns
				// it, and the marker is kept for the later of their times.
				it.res.Outcome = Duplicate
				it.res.First = &idemstore.Marker{Key: it.claim.Key, MessageID: owner.msg.ID, BodySHA256: owner.claim.BodySHA256}
				it.res.Conflict = !bytes.Equal(owner.claim.BodySHA256, it.claim.BodySHA256)
				if it.claim.EventTime.After(owner.claim.EventTime) {
					owner.claim.EventTime = it.claim.EventTime
				}
				continue
			}
			owners[it.claim.Key] = it
			owned = append(owned, it)
		}
		// Sorted keys make every transaction lock markers in the same
		// order, so two batches with overlapping keys wait for each other
		// instead of deadlocking.
		slices.SortFunc(owned, func(a, b *item) int { return strings.Compare(a.claim.Key, b.claim.Key) })
	}
	claims := make([]idemstore.Claim, len(owned))
	for i, o := range owned {
		claims[i] = o.claim
	}
	inserted, err := p.store.Claim(ctx, tx, p.cfg.Consumer, claims, p.lockTimeout())
	if err != nil {
		return nil, false, wrapStep(stepClaim, err)
	}
	if len(inserted) != len(claims) {
		return nil, false, fmt.Errorf("claiming inbox keys: store answered %d results for %d claims", len(inserted), len(claims))
	}
	var dups []string
	var dupOwners []*item
	for i, o := range owned {
		if inserted[i] {
			o.fresh = true
		} else {
			o.res.Outcome = Duplicate
			dups = append(dups, o.claim.Key)
			dupOwners = append(dupOwners, o)
		}
	}
	if len(dups) > 0 {
		markers, err := p.store.Lookup(ctx, tx, p.cfg.Consumer, dups)
		if err != nil {
			return nil, false, wrapStep(stepLookup, err)
		}
		var ext []idemstore.Extension
		for i, k := range dups {
			m, ok := markers[k]
			if !ok {
				continue
			}
			it := dupOwners[i]
			it.res.First = &m
			it.res.Conflict = !bytes.Equal(m.BodySHA256, it.claim.BodySHA256)
			if !m.KeepUntil.IsZero() && it.claim.EventTime.After(m.KeepUntil) {
				ext = append(ext, idemstore.Extension{Key: k, KeepUntil: it.claim.EventTime})
			}
		}
		if len(ext) > 0 && p.partitionTime == nil {
			// Partitioned markers cannot move to a later day; their
			// partition time is the key's own, and the horizon expires by
			// it, so they need no extension.
			if err := p.store.Extend(ctx, tx, p.cfg.Consumer, ext); err != nil {
				return nil, false, wrapStep(stepExtend, err)
			}
			extended = true
		}
	}
	if len(dups) == 0 && len(owned) == len(items) {
		fresh = items // every message claimed its own key
	} else {
		fresh = make([]*item, 0, len(owned)-len(dups))
		for _, it := range items {
			if it.fresh {
				fresh = append(fresh, it)
			}
		}
	}
	claimed := len(fresh)
	if fresh, err = p.refuseFreshLate(ctx, tx, fresh); err != nil {
		return nil, false, err
	}
	if len(fresh) < claimed && (len(items) > 1 || extended || p.needsCommit(tx)) {
		// A refused message's marker is in this transaction, which its
		// neighbours would commit: the marker would then answer its
		// redeliveries Duplicate, never applied. The transaction is
		// rolled back, and its messages go one at a time, where a refused
		// one's transaction has nothing to commit.
		return nil, false, errLateInShared
	}
	p.markLate(fresh)
	return fresh, extended, nil
}

// handle runs the handler for fresh, in message order. A panic is a poison
// message: it becomes a permanent error rather than a crash loop (in a batch,
// the message-by-message retry then finds the culprit). shared says ctx is
// a batch's shared transaction's, not the message's own.
func (p *Processor[TTx]) handle(ctx context.Context, tx TTx, fresh []*item, shared bool) (err error) {
	if len(fresh) == 0 {
		return nil
	}
	current := fresh[0]
	defer func() {
		if r := recover(); r != nil {
			current.handlerFailed = true
			err = Permanent(fmt.Errorf("handler panicked on message %s: %v", current.msg.ID, r))
		}
	}()
	if p.cfg.HandleBatch != nil {
		msgs := make([]Message, len(fresh))
		for i, it := range fresh {
			msgs[i] = it.msg
		}
		if err := p.cfg.HandleBatch(ctx, tx, msgs); err != nil {
			if len(fresh) == 1 {
				return fmt.Errorf("handling message %s: %w", current.msg.ID, err)
			}
			return fmt.Errorf("handling batch of %d messages: %w", len(fresh), err)
		}
		return nil
	}
	for _, it := range fresh {
		current = it
		hctx, cancel := ctx, context.CancelFunc(nil)
		if shared && it.ctx != nil {
			hctx, cancel = messageContext(ctx, it.ctx)
		}
		err := func() error {
			if cancel != nil {
				defer cancel() // a panic too releases the message's context
			}
			return p.cfg.Handler(hctx, tx, it.msg)
		}()
		if err != nil {
			it.handlerFailed = true
			return fmt.Errorf("handling message %s: %w", it.msg.ID, err)
		}
	}
	return nil
}

// messageContext is the context a handler in a batch's shared transaction
// runs under: its message's span (msg, which shares ctx's cancellation:
// both derive from the batch's context) under the deadline of the
// transaction (ctx).
func messageContext(tx, msg context.Context) (context.Context, context.CancelFunc) {
	if d, ok := tx.Deadline(); ok {
		return context.WithDeadline(msg, d)
	}
	return msg, func() {}
}

func (p *Processor[TTx]) fault(ctx context.Context, point FaultPoint, items []*item) error {
	if p.cfg.Faults == nil {
		return nil
	}
	msgs := make([]Message, len(items))
	for i, it := range items {
		msgs[i] = it.msg
	}
	if err := p.cfg.Faults(ctx, point, msgs); err != nil {
		return fmt.Errorf("fault at %s: %w", point, err)
	}
	return nil
}

func (p *Processor[TTx]) lockTimeout() time.Duration {
	if p.cfg.LockTimeout < 0 {
		return 0
	}
	return p.cfg.LockTimeout
}

// afterCommitError is a failure after the commit and before the ack: the
// effect is durable, but the broker must not be acked (a crash there).
type afterCommitError struct{ err error }

func (e *afterCommitError) Error() string { return "after commit: " + e.err.Error() }
func (e *afterCommitError) Unwrap() error { return e.err }

// needsCommit reports whether the store asks for tx to be committed
// although nothing in it was applied ([idemstore.Store.NeedsCommit]).
func (p *Processor[TTx]) needsCommit(tx TTx) bool {
	return p.store.NeedsCommit(tx)
}

// pingTimeout bounds the ping that tells a handler's own deadline on a
// slow query from one on a database that stopped answering.
const pingTimeout = time.Second

func (p *Processor[TTx]) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pingTimeout)
	defer cancel()
	return p.store.Ping(ctx)
}
