package idem

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// ErrExpired is wrapped by the error of an Expired result.
var ErrExpired = errors.New("message older than the inbox retention window")

// Horizon is the retention guard of a consumer (docs/design.md 8): markers are
// kept for Window, so a message whose event time is older than that cannot
// be proven new — its marker may already be pruned. Such a message gets the
// outcome Expired instead of being silently applied again.
type Horizon struct {
	// Window is how long the inbox keeps markers; it must match the store's
	// retention. 0 takes the store's window
	// ([github.com/idemkit/idem/idemstore.Store.Window]), and then the
	// window stored with its table; -1 disables the guard.
	Window time.Duration
	// Skew is a safety margin for clocks: a message is expired once its event
	// time is older than Window minus Skew, so a producer clock running ahead
	// cannot make the guard accept a message whose marker prune removes.
	// Defaults to 5 minutes when Window is set.
	Skew time.Duration
	// ApplyExpired applies an expired message anyway, with a Warn log, for
	// consumers whose effect is safe to repeat after that long. Off by
	// default: expired messages are dead-lettered.
	ApplyExpired bool
	// MaxAhead is how far ahead of the consumer's clock an event time may
	// be. A later one (a producer clock gone wrong) is not trusted: the
	// message is treated as untimed, so no marker is kept for a time that
	// has not come yet and no prune re-scans it. Defaults to, and may not
	// exceed, 1 hour: the stores bound a marker's keep-until to an hour past
	// their own clock, and a trusted time beyond it would outlive its marker.
	MaxAhead time.Duration
	// Now returns the current time. Defaults to time.Now; tests set it.
	Now func() time.Time
}

func (h *Horizon) setDefaults() {
	if h.Window > 0 && h.Skew == 0 {
		h.Skew = min(5*time.Minute, h.Window/10)
	}
	if h.MaxAhead == 0 {
		h.MaxAhead = maxAhead
	}
	if h.Now == nil {
		h.Now = time.Now
	}
}

// maxAhead is the furthest an event time may be ahead and still be trusted.
const maxAhead = time.Hour

func (h *Horizon) validate() error {
	if h.Window < -1 || h.Skew < 0 || (h.Window > 0 && h.Skew >= h.Window) {
		return fmt.Errorf("horizon window %v with skew %v: both must be positive and skew smaller than the window", h.Window, h.Skew)
	}
	if h.MaxAhead < 0 || h.MaxAhead > maxAhead {
		return fmt.Errorf("horizon max ahead %v must be positive and at most %v (the stores bound keep-until to that)", h.MaxAhead, maxAhead)
	}
	return nil
}

// ahead reports whether t lies further in the future than MaxAhead.
func (h *Horizon) ahead(t time.Time) bool {
	return !t.IsZero() && t.After(h.Now().Add(h.MaxAhead))
}

// checkPartition is check for a partitioned inbox, which keeps a marker
// as long as the day of its partition time: a message whose partition
// time is older than the window may have lost its marker with its day.
func (h *Horizon) checkPartition(pt time.Time) error {
	if h.Window <= 0 {
		return nil
	}
	limit := h.Now().Add(-h.Window + h.Skew)
	if pt.Before(limit) {
		return fmt.Errorf("%w: partition time %s is before %s (window %v, skew %v): its day may have been dropped",
			ErrExpired, pt.UTC().Format(time.RFC3339), limit.UTC().Format(time.RFC3339), h.Window, h.Skew)
	}
	return nil
}

// check returns a non-nil error when msg is too old to be proven new. A
// message without an event time cannot be judged and passes; stores whose
// layout needs the time (the partitioned inbox) refuse it themselves.
func (h *Horizon) check(msg Message) error {
	if h.Window <= 0 || msg.Time.IsZero() {
		return nil
	}
	limit := h.Now().Add(-h.Window + h.Skew)
	if msg.Time.Before(limit) {
		return fmt.Errorf("%w: event time %s is before %s (window %v, skew %v)",
			ErrExpired, msg.Time.UTC().Format(time.RFC3339), limit.UTC().Format(time.RFC3339), h.Window, h.Skew)
	}
	return nil
}

// TimeFromUUIDv7 returns the time inside a UUIDv7 (RFC 9562): its first 48
// bits are Unix milliseconds. It is a delivery-stable event time whenever
// the producer assigns UUIDv7 message IDs. ok is false for anything that is
// not a UUIDv7.
func TimeFromUUIDv7(id string) (t time.Time, ok bool) {
	s := id
	if len(id) == 36 {
		if id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
			return time.Time{}, false
		}
		s = id[:8] + id[9:13] + id[14:18] + id[19:23] + id[24:]
	}
	if len(s) != 32 {
		return time.Time{}, false
	}
	b, err := hex.DecodeString(s)
	if err != nil || b[6]>>4 != 7 || b[8]>>6 != 2 {
		return time.Time{}, false
	}
	var ms int64
	for _, x := range b[:6] {
		ms = ms<<8 | int64(x)
	}
	return time.UnixMilli(ms).UTC(), true
}

// NewUUIDv7 returns a new UUIDv7 (RFC 9562) whose time is at, to use as a
// message ID: its time is then the most stable event time a message can
// carry (the same on every redelivery, republish and replay), and the
// partition time of a partitioned inbox keyed by ID. Producers call it with
// time.Now().
func NewUUIDv7(at time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70 | b[6]&0x0f // version 7
	b[8] = 0x80 | b[8]&0x3f // variant 10
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Window is the horizon in force: how old a message may be and still be
// guarded by its marker. After [Processor.Check] (or the first message) it
// reflects the inbox's stored window; 0 or less means no horizon guard.
// Adapters compare it with how long their broker keeps messages, so that a
// replay cannot reach past it unnoticed.
func (p *Processor[TTx]) Window() time.Duration { return p.horizon().Window }
