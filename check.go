package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// ErrInboxNotReady is wrapped by [Processor.Check] when the inbox cannot be
// used: its table is missing, not writable, or its stored settings
// contradict the consumer's.
var ErrInboxNotReady = errors.New("inbox not ready")

// stepSchema is Check's look at the inbox table's schema.
const stepSchema = "checking the inbox schema"

// checkKey is the key of the probe claim Check makes and rolls back.
const checkKey = "idem.check"

// Check proves, before a consumer takes its first message, that the inbox
// can be used: it verifies the table ([idemstore.Store.Check]: its
// columns, unique key, indexes, layout, stored settings, schema version
// and partitions), reads the stored settings (when the store keeps them),
// records the consumer's own horizon (when it set one: the stored window
// cannot then be shortened below it without force), and makes one claim in
// a transaction it rolls back, which fails when the table is missing, not
// writable, or (partitioned) has no partition for today.
// Broker adapters call it at the start of Run and refuse to start on an
// error, which wraps [ErrInboxNotReady] and says how to fix it. It writes
// nothing. A paused consumer passes: it starts, and holds its messages.
func (p *Processor[TTx]) Check(ctx context.Context) error {
	if err := p.checkSchema(ctx); err != nil {
		return err
	}
	// A paused consumer starts, and holds its messages until resumed.
	if err := p.ready(ctx, true); err != nil && !errors.Is(err, ErrPaused) {
		return p.notReady(err)
	}
	p.checkDurability(ctx)
	if p.cfg.Natural {
		return nil
	}
	// A horizon the consumer set itself is recorded, so that the stored
	// window cannot be shortened below it unawares; one that follows the
	// stored window needs no record.
	if p.userHorizon.Window > 0 {
		if err := p.store.RecordHorizon(ctx, p.cfg.Consumer, p.userHorizon.Window); err != nil {
			return p.notReady(wrapStep(stepSettings, err))
		}
	}
	tx, err := p.store.Begin(ctx)
	if err != nil {
		return p.notReady(wrapStep(stepBegin, err))
	}
	defer func() { _ = p.store.Rollback(context.WithoutCancel(ctx), tx) }()
	now := time.Now().UTC()
	c := idemstore.Claim{Key: checkKey, MessageID: checkKey, BodySHA256: BodyHash(nil), EventTime: now}
	if p.partitioned() {
		c.PartitionTime = now
	}
	if _, err := p.store.Claim(ctx, tx, p.cfg.Consumer, []idemstore.Claim{c}, p.lockTimeout()); err != nil {
		return p.notReady(wrapStep(stepClaim, err))
	}
	if _, err := p.store.Lookup(ctx, tx, p.cfg.Consumer, []string{checkKey}); err != nil {
		return p.notReady(wrapStep(stepLookup, err))
	}
	return nil
}

// checkSchema asks the store about its table ([idemstore.Store.Check]) and
// refuses any problem but an advisory one (logged), each with its fix, in a
// [SchemaError].
func (p *Processor[TTx]) checkSchema(ctx context.Context) error {
	if p.cfg.Natural {
		return nil
	}
	if p.cfg.TxTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.TxTimeout)
		defer cancel()
	}
	probs, err := p.store.Check(ctx)
	if err != nil {
		return p.notReady(wrapStep(stepSchema, err))
	}
	var stop []idemstore.SchemaProblem
	for _, pr := range probs {
		if pr.Advisory {
			p.cfg.Logger.Warn("inbox table problem a consumer starts with", "consumer", p.cfg.Consumer, "problem", pr.What, "fix", pr.Fix)
			continue
		}
		stop = append(stop, pr)
	}
	if len(stop) > 0 {
		return fmt.Errorf("%w: consumer %s: %w", ErrInboxNotReady, p.cfg.Consumer, &SchemaError{Problems: stop})
	}
	return nil
}

// notReady wraps a failed check with what to do about it.
func (p *Processor[TTx]) notReady(err error) error {
	switch classify(p.store, err) {
	case idemstore.ClassConfig:
		if errors.Is(err, ErrConfig) {
			return fmt.Errorf("%w: consumer %s: %w", ErrInboxNotReady, p.cfg.Consumer, err)
		}
		return fmt.Errorf("%w: consumer %s: %w (is the inbox migrated? run: idem inbox migrate; does the role have INSERT on it?)", ErrInboxNotReady, p.cfg.Consumer, err)
	case idemstore.ClassUnavailable:
		// An outage, not a misconfiguration: a caller may wait it out.
		return fmt.Errorf("%w: %w: consumer %s: %w", ErrInboxNotReady, ErrUnavailable, p.cfg.Consumer, err)
	}
	return fmt.Errorf("%w: consumer %s: %w", ErrInboxNotReady, p.cfg.Consumer, err)
}

// partitioned reports whether the processor places keys in a partitioned
// inbox.
func (p *Processor[TTx]) partitioned() bool { return p.partitionTime != nil }

// notReadyResult is the result of a message the processor could not take
// because the inbox is not ready (settings unreadable, a horizon the stored
// window refuses): not the message's fault, so adapters hold it.
func notReadyResult(msg Message, err error) Result {
	return Result{Outcome: Retry, MessageID: msg.ID, Err: err, Blameless: true}
}

// checkDurability logs, at start, every way the store's database could
// lose a commit it acknowledged ([idemstore.Store.Durability]), and again at a
// later Check only when the risks changed. It never stops the consumer: a
// role that cannot read the settings is logged.
func (p *Processor[TTx]) checkDurability(ctx context.Context) {
	if p.cfg.TxTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.TxTimeout)
		defer cancel()
	}
	d, err := p.store.Durability(ctx)
	if err != nil {
		p.cfg.Logger.Info("could not read the database's commit and replication settings", "consumer", p.cfg.Consumer, "error", err)
		return
	}
	var seen strings.Builder
	for _, r := range d.Risks {
		seen.WriteString(r.What + "\n")
	}
	now := seen.String()
	if last := p.durabilityLogged.Swap(&now); last != nil && *last == now {
		return // logged at an earlier Check (the adapters check again after an outage)
	}
	for _, r := range d.Risks {
		p.cfg.Logger.Warn("acknowledged effects could be lost", "consumer", p.cfg.Consumer, "risk", r.What, "fix", r.Fix, "settings", d.Summary())
	}
}
