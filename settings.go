package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// settingsTTL is how long a processor trusts the inbox settings it read
// before it reads them again: a window changed with `idem inbox window set`
// reaches every running consumer within it.
const settingsTTL = time.Minute

// inboxState is what a processor knows of its inbox's stored settings, and
// the horizon it derived from them.
type inboxState struct {
	mu      sync.Mutex
	next    atomic.Int64 // unix nanoseconds of the next read; 0: never read
	horizon atomic.Pointer[Horizon]
	pruned  atomic.Pointer[[]idemstore.PrunedSummary]
}

// horizon is the guard in force.
func (p *Processor[TTx]) horizon() *Horizon { return p.inbox.horizon.Load() }

// ready makes sure the processor guards with the inbox's stored window
// (docs/design.md 10): it reads the settings before the first message and every
// settingsTTL after, and fails, wrapping [ErrConfig], when the consumer's
// horizon is longer than the stored window or the stored layout is not the
// store's. force reads them now.
func (p *Processor[TTx]) ready(ctx context.Context, force bool) error {
	return p.readyIn(ctx, force, nil)
}

// readyIn is ready, reading in *in, a transaction the caller holds, when in
// is not nil ([idemstore.Store.SettingsIn]): the caller of ProcessTx may
// hold the pool's only connection. While the consumer is paused it fails
// with a [*PausedError], which wraps [ErrPaused].
func (p *Processor[TTx]) readyIn(ctx context.Context, force bool, in *TTx) error {
	// One clock read for both checks: on some virtual machines a read of
	// the clock is a system call.
	now := time.Now().UnixNano()
	if err := p.readySettings(ctx, force, in, now); err != nil {
		return err
	}
	return p.checkPause(ctx, in, now)
}

// readySettings reads the stored settings for readyIn, unless they were
// read less than settingsTTL before now (unix nanoseconds).
func (p *Processor[TTx]) readySettings(ctx context.Context, force bool, in *TTx, now int64) error {
	if p.cfg.Natural {
		return nil // a natural consumer keeps no markers: no inbox to read
	}
	if !force && now < p.inbox.next.Load() {
		return nil
	}
	locked := true
	switch {
	case p.inbox.next.Load() != 0 && !force:
		// Settings were read before: one caller reads them again while
		// the others go on with those it read last.
		if !p.inbox.mu.TryLock() {
			return nil
		}
	case in != nil:
		// The caller holds a connection (its transaction): it never waits
		// for the reader that holds the lock, which may be waiting for a
		// connection of the pool (docs/design.md 13); it reads in its own
		// transaction, and two reads store the same settings.
		locked = p.inbox.mu.TryLock()
	default:
		p.inbox.mu.Lock()
	}
	if locked {
		defer p.inbox.mu.Unlock()
	}
	if !force && time.Now().UnixNano() < p.inbox.next.Load() {
		return nil // another call read them meanwhile
	}
	if p.cfg.TxTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.TxTimeout)
		defer cancel()
	}
	s, err := p.settings(ctx, in)
	if err != nil {
		return wrapStep(stepSettings, err)
	}
	// A store that records no settings (a store for tests) returns none:
	// the consumer then guards with its own horizon.
	if s != (idemstore.Settings{}) {
		h, err := p.horizonFor(s)
		if err != nil {
			return err
		}
		if p.inbox.next.Load() == 0 && p.userHorizon.Window < 0 {
			p.cfg.Logger.Warn("horizon guard disabled (Horizon.Window -1): a message older than the stored window is applied again if its marker was pruned",
				"consumer", p.cfg.Consumer, "window", s.Window)
		}
		if old := p.horizon(); old.Window != h.Window && (p.inbox.next.Load() == 0 || h.Window < old.Window) {
			// Logged when first read and when it shrinks; not at each read
			// while a lengthened window grows second by second (the
			// command that lengthened it logged that).
			p.cfg.Logger.Info("inbox retention window in force", "consumer", p.cfg.Consumer,
				"window", s.Window, "horizon", h.Window, "previous_horizon", old.Window)
		}
		p.inbox.horizon.Store(&h)
	}
	if err := p.loadPrunedIn(ctx, in); err != nil {
		return err
	}
	p.inbox.next.Store(time.Now().Add(settingsTTL).UnixNano())
	return nil
}

// settings reads the stored settings, in *in when it is not nil.
func (p *Processor[TTx]) settings(ctx context.Context, in *TTx) (idemstore.Settings, error) {
	if in != nil {
		return p.store.SettingsIn(ctx, *in)
	}
	return p.store.Settings(ctx)
}

// loadPrunedIn is loadPruned, reading in *in when it is not nil.
func (p *Processor[TTx]) loadPrunedIn(ctx context.Context, in *TTx) error {
	if in == nil || p.cfg.Natural {
		return p.loadPruned(ctx)
	}
	sums, err := p.store.PrunedSummariesIn(ctx, *in, p.cfg.Consumer)
	if err != nil {
		return wrapStep(stepSettings, fmt.Errorf("reading pruned-key summaries: %w", err))
	}
	p.inbox.pruned.Store(&sums)
	return nil
}

// horizonFor is the consumer's guard under the stored settings s: the
// stored window when the consumer set none, its own when shorter, and an
// error when longer (the guard would accept messages whose markers prune
// removes).
func (p *Processor[TTx]) horizonFor(s idemstore.Settings) (Horizon, error) {
	if l := p.store.Layout(); l != s.Layout {
		return Horizon{}, fmt.Errorf("%w: consumer %s: the store is configured for the %s layout but the inbox table was created %s",
			ErrConfig, p.cfg.Consumer, l, s.Layout)
	}
	h := p.userHorizon
	stored := s.Stored
	if stored == 0 {
		stored = s.Window
	}
	switch {
	case h.Window == 0:
		h.Window = s.Window
	case h.Window > stored:
		return Horizon{}, fmt.Errorf("%w: consumer %s: horizon window %v is longer than the inbox's stored retention window %v: a message older than the window would find its marker pruned and be applied again (shorten the horizon, or lengthen the window with: idem inbox window set %v)",
			ErrConfig, p.cfg.Consumer, h.Window, stored, h.Window)
	case h.Window > s.Window:
		// The stored window was lengthened to cover this horizon and is
		// still ramping up: guard with what the markers already cover.
		h.Window = s.Window
	}
	h.setDefaults()
	if err := h.validate(); err != nil {
		return Horizon{}, fmt.Errorf("%w: consumer %s under the stored window %v: %w", ErrConfig, p.cfg.Consumer, s.Window, err)
	}
	return h, nil
}

// readyWait is ready, waiting out an unreachable database the way a
// transaction does (RetryPolicy.WaitUnavailable): reading the settings
// carries nothing of any message.
func (p *Processor[TTx]) readyWait(ctx context.Context) error {
	r := p.retrier(p.cfg.Retry)
	for {
		err := p.ready(ctx, false)
		if err == nil || errors.Is(err, ErrPaused) {
			return err // a pause is held at once, not waited out
		}
		v := r.next(ctx, err)
		if !v.again {
			return v.err
		}
		t := time.NewTimer(v.wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (after: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}
