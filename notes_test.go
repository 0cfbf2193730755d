package idem

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// countHandler counts the records logged at each level.
type countHandler struct{ info, debug atomic.Int64 }

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelDebug {
		h.debug.Add(1)
	} else {
		h.info.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// A run of 100,000 duplicates (a broker restart's redeliveries) prints one
// Debug line each and an Info summary a minute, not 100,000 Info lines.
func TestDuplicatesAreSummarised(t *testing.T) {
	h := &countHandler{}
	p := procFor(t, nopStore{}, func(c *Config[struct{}]) { c.Logger = slog.New(h) })
	for i := range 100_000 {
		p.report(Result{Outcome: Duplicate, MessageID: "m", First: &idemstore.Marker{MessageID: "m", ProcessedAt: time.Now().Add(-time.Duration(i) * time.Millisecond)}}, 0)
	}
	if h.info.Load() != 1 || h.debug.Load() != 100_000 {
		t.Fatalf("%d Info and %d Debug lines for 100,000 duplicates; want 1 summary and one Debug line each", h.info.Load(), h.debug.Load())
	}
	quiet := &countHandler{}
	q := procFor(t, nopStore{}, func(c *Config[struct{}]) { c.Logger = slog.New(levelHandler{quiet, slog.LevelInfo}) })
	for range 1000 {
		q.report(Result{Outcome: Duplicate, MessageID: "m"}, 0)
	}
	if quiet.debug.Load() != 0 || quiet.info.Load() != 1 {
		t.Fatalf("at level Info: %d Debug, %d Info lines for 1,000 duplicates", quiet.debug.Load(), quiet.info.Load())
	}
}

// levelHandler passes records at or above min.
type levelHandler struct {
	*countHandler
	min slog.Level
}

func (h levelHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
