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

// PauseTTL is how long a processor trusts the pause it last read before it
// reads it again: a consumer paused with `idem consumer pause` stops
// claiming within it, in every process. Between reads, checking the pause
// costs two atomic loads.
const PauseTTL = time.Second

// PauseHoldDelay is the delay of the disposition of a message held because
// its consumer is paused: the adapters process it again after it, and hold
// it again until the consumer is resumed.
const PauseHoldDelay = 2 * time.Second

// ErrPaused is wrapped by the Result.Err of every message a paused consumer
// holds: the message is not applied, nothing of it is written, and no
// attempt of its is spent (Result.Blameless; disposition
// [ActionHold]). The error is a [*PausedError].
var ErrPaused = errors.New("consumer paused")

// PausedError says who paused the consumer, when and why.
type PausedError struct {
	Consumer string
	idemstore.Pause
}

func (e *PausedError) Error() string {
	return fmt.Sprintf("consumer %s paused since %s by %s: %s", e.Consumer, e.Since.UTC().Format(time.RFC3339), e.By, e.Why)
}

// Is makes errors.Is(err, ErrPaused) true.
func (e *PausedError) Is(target error) bool { return target == ErrPaused }

// PauseHook receives a consumer's pause each time a processor finds it
// changed: paused (p.Paused), or resumed (the zero Pause).
type PauseHook interface {
	OnPause(consumer string, p idemstore.Pause)
}

// pauseState is what a processor knows of its consumer's pause.
type pauseState struct {
	mu   sync.Mutex
	next atomic.Int64 // unix nanoseconds of the next read; 0: never read
	cur  atomic.Pointer[idemstore.Pause]
	// warned is set once a failed read was logged, until a read succeeds.
	warned atomic.Bool
}

// Paused returns the consumer's pause as the processor last read it (at
// most [PauseTTL] ago while messages come); the zero Pause when it is not
// paused or its store keeps no pauses.
func (p *Processor[TTx]) Paused() idemstore.Pause {
	if c := p.pause.cur.Load(); c != nil {
		return *c
	}
	return idemstore.Pause{}
}

// checkPause returns a [*PausedError] while the consumer is paused, reading
// the pause, in *in when it is not nil, when the one read last is older
// than [PauseTTL] at now (unix nanoseconds). A failed read keeps the pause
// read before: the database's outage is the settings' and the claims' to
// report.
func (p *Processor[TTx]) checkPause(ctx context.Context, in *TTx, now int64) error {
	if next := p.pause.next.Load(); now >= next {
		// The first read blocks the others: none may claim before the
		// consumer's pause is known. Later ones go on with the pause read
		// last while one caller reads it again.
		switch {
		case next == 0 && in != nil && !p.pause.mu.TryLock():
			// The caller holds a connection (its transaction): it never
			// waits for the reader that holds the lock, which may be
			// waiting for a connection of the pool (docs/design.md 13);
			// it reads in its own transaction.
			p.refreshPause(ctx, in)
		case next == 0 && in != nil:
			p.refreshPause(ctx, in)
			p.pause.mu.Unlock()
		case next == 0:
			p.pause.mu.Lock()
			p.refreshPause(ctx, in)
			p.pause.mu.Unlock()
		case p.pause.mu.TryLock():
			p.refreshPause(ctx, in)
			p.pause.mu.Unlock()
		}
	}
	if c := p.pause.cur.Load(); c != nil && c.Paused {
		return &PausedError{Consumer: p.cfg.Consumer, Pause: *c}
	}
	return nil
}

// refreshPause reads the pause unless another caller did meanwhile; the
// caller holds p.pause.mu, or reads in its own transaction (in) while
// another holds it: two reads then store the same pause.
func (p *Processor[TTx]) refreshPause(ctx context.Context, in *TTx) {
	if time.Now().UnixNano() < p.pause.next.Load() {
		return
	}
	if p.cfg.TxTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.TxTimeout)
		defer cancel()
	}
	var got idemstore.Pause
	var err error
	if in != nil {
		got, err = p.store.PausedIn(ctx, *in, p.cfg.Consumer)
	} else {
		got, err = p.store.Paused(ctx, p.cfg.Consumer)
	}
	// A failed read is tried again after PauseTTL too: a role that may not
	// read the pauses must not read them at every message.
	p.pause.next.Store(time.Now().Add(PauseTTL).UnixNano())
	if err != nil {
		if !p.pause.warned.Swap(true) {
			p.cfg.Logger.Warn("could not read the consumer's pause: it goes on with the pause it read last (none at start)",
				"consumer", p.cfg.Consumer, "error", err)
		}
		return
	}
	p.pause.warned.Store(false)
	old := p.pause.cur.Swap(&got)
	was := old != nil && old.Paused
	switch {
	case got.Paused && (!was || old.Since != got.Since):
		p.cfg.Logger.Warn("consumer paused: holding its messages until resumed", "consumer", p.cfg.Consumer,
			"paused_by", got.By, "why", got.Why, "since", got.Since)
		Each(p.hooks, func(h PauseHook) { h.OnPause(p.cfg.Consumer, got) })
	case !got.Paused && was:
		p.cfg.Logger.Info("consumer resumed", "consumer", p.cfg.Consumer, "paused_by", old.By, "paused_since", old.Since)
		Each(p.hooks, func(h PauseHook) { h.OnPause(p.cfg.Consumer, got) })
	}
}
