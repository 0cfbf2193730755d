package idem

import (
	"bytes"
	"context"
	"fmt"

	"github.com/idemkit/idem/idemstore"
)

// Predict says what a delivery of msg would do now, without running the
// handler and without writing anything: the outcome Process would give it
// if nothing changed in between, decided by the processor's own rules in
// its own order — the message ID, the event time and the horizon, the key
// function and the key's validity, the partition time, the pruned-key
// summaries (Config.RefuseLate) and last the key's marker, looked up in a
// transaction that is rolled back. Tools that judge a message before they
// send it (dead-letter redrives and replays, a console) ask this rather
// than re-deriving the rules.
//
// The result is Applied (PrunedOn set when a prune probably deleted the
// key's marker: a late duplicate applied again), Duplicate (First is the
// marker found, Conflict says whether its body differs), DeadLettered or
// Expired with the error Process would give. The settings and summaries
// are those the processor guards with, read at most a minute ago; call
// [Processor.Refresh] first to read them now. An error means the inbox
// could not be read: nothing is predicted.
func (p *Processor[TTx]) Predict(ctx context.Context, msg Message) (Result, error) {
	if err := p.ready(ctx, false); err != nil {
		return Result{MessageID: msg.ID}, err
	}
	it := new(item)
	p.admit(it, msg, true)
	if it.res.Outcome != 0 {
		return it.res, nil
	}
	if p.cfg.Natural {
		// No marker is kept: every delivery runs the handler.
		it.res.Outcome = Applied
		return it.res, nil
	}
	m, ok, err := p.lookupMarker(ctx, it.claim.Key)
	if err != nil {
		return Result{MessageID: msg.ID, Key: it.res.Key}, err
	}
	p.judgeMarker(it, m, ok)
	return it.res, nil
}

// PredictBatch is [Processor.Predict] for many messages at once: the same
// answers, in msgs' order, with the markers of all their keys read in one
// lookup in one rolled-back transaction instead of one transaction per
// message. An error means the inbox could not be read: nothing is
// predicted.
func (p *Processor[TTx]) PredictBatch(ctx context.Context, msgs []Message) ([]Result, error) {
	if err := p.ready(ctx, false); err != nil {
		return nil, err
	}
	items := make([]*item, len(msgs))
	var keys []string
	seen := make(map[string]bool, len(msgs))
	for i, msg := range msgs {
		it := new(item)
		p.admit(it, msg, true)
		items[i] = it
		if it.res.Outcome != 0 {
			continue
		}
		if p.cfg.Natural {
			it.res.Outcome = Applied
			continue
		}
		if !seen[it.claim.Key] {
			seen[it.claim.Key] = true
			keys = append(keys, it.claim.Key)
		}
	}
	markers, err := p.lookupMarkers(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := make([]Result, len(msgs))
	for i, it := range items {
		if it.res.Outcome == 0 {
			m, ok := markers[it.claim.Key]
			p.judgeMarker(it, m, ok)
		}
		out[i] = it.res
	}
	return out, nil
}

// judgeMarker completes the prediction of an admitted item from its key's
// marker (ok: one was found).
func (p *Processor[TTx]) judgeMarker(it *item, m idemstore.Marker, ok bool) {
	if ok {
		it.res.Outcome = Duplicate
		it.res.First = &m
		it.res.Conflict = !bytes.Equal(m.BodySHA256, it.claim.BodySHA256)
		return
	}
	it.res.Outcome = Applied
	if p.needsLateCheck(it) {
		if day, ok := p.prunedOn(it.claim.Key); ok {
			it.res.PrunedOn = day
		}
	}
}

// Refresh reads the inbox's stored settings and pruned-key summaries now,
// instead of at most a minute ago: for a tool about to act on what
// [Processor.Predict] said.
func (p *Processor[TTx]) Refresh(ctx context.Context) error {
	return p.ready(ctx, true)
}

// lookupMarker reads key's marker in a transaction of its own, which it
// rolls back: it writes nothing and holds no lock past its return.
func (p *Processor[TTx]) lookupMarker(ctx context.Context, key string) (idemstore.Marker, bool, error) {
	ms, err := p.lookupMarkers(ctx, []string{key})
	if err != nil {
		return idemstore.Marker{}, false, err
	}
	m, ok := ms[key]
	return m, ok, nil
}

// lookupMarkers reads the markers of keys in a transaction of its own,
// which it rolls back: it writes nothing and holds no lock past its return.
func (p *Processor[TTx]) lookupMarkers(ctx context.Context, keys []string) (map[string]idemstore.Marker, error) {
	if len(keys) == 0 {
		return map[string]idemstore.Marker{}, nil
	}
	if p.cfg.TxTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.TxTimeout)
		defer cancel()
	}
	tx, err := p.store.Begin(ctx)
	if err != nil {
		return nil, wrapStep(stepBegin, err)
	}
	defer func() { _ = p.store.Rollback(context.WithoutCancel(ctx), tx) }()
	ms, err := p.store.Lookup(ctx, tx, p.cfg.Consumer, keys)
	if err != nil {
		if len(keys) == 1 {
			err = fmt.Errorf("key %q: %w", keys[0], err)
		}
		return nil, wrapStep(stepLookup, err)
	}
	return ms, nil
}
