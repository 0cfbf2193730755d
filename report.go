package idem

import (
	"context"
	"log/slog"
	"time"
)

// Report logs and counts an outcome that a broker adapter decided itself,
// outside Process: a message it dead-letters after its own retry budget, or
// one it refuses before the processor sees it (a bad header). Every outcome
// a consumer ends with is then in the log and in the metrics.
func (p *Processor[TTx]) Report(r Result) { p.report(r, 0) }

// report logs and counts one result: every outcome is observed, and those a
// person should see are logged.
func (p *Processor[TTx]) report(r Result, elapsed time.Duration) {
	Each(p.hooks, func(h OutcomeHook) { h.OnOutcome(p.cfg.Consumer, r, elapsed) })
	log := p.cfg.Logger
	ctx := context.Background()
	attrs := []slog.Attr{
		slog.String("consumer", p.cfg.Consumer),
		slog.String("key", r.Key),
		slog.String("message_id", r.MessageID),
	}
	switch r.Outcome {
	case Applied:
		if log.Enabled(ctx, slog.LevelDebug) {
			log.LogAttrs(ctx, slog.LevelDebug, "message applied", append(attrs, slog.Int("attempts", r.Attempts))...)
		}
	case Duplicate:
		var age time.Duration
		if r.First != nil {
			attrs = append(attrs, slog.String("first_message_id", r.First.MessageID))
			if !r.First.ProcessedAt.IsZero() {
				age = time.Since(r.First.ProcessedAt)
				attrs = append(attrs, slog.Duration("first_age", age))
			}
		}
		if r.Conflict {
			log.LogAttrs(ctx, slog.LevelWarn, "duplicate key with a different body skipped (producer reused a key?)", attrs...)
			return
		}
		// Redeliveries come by the thousand after a broker restart: one
		// Debug line each, and an Info summary a minute.
		if log.Enabled(ctx, slog.LevelDebug) {
			log.LogAttrs(ctx, slog.LevelDebug, "duplicate skipped", attrs...)
		}
		p.notes.duplicate(log, p.cfg.Consumer, age)
	case Retry:
		if r.Blameless {
			// An outage or a misconfigured inbox holds every message the
			// same way for as long as it lasts: one line a minute, with
			// the count and the fix, not one per message and try.
			p.notes.held(log, p.cfg.Consumer, r)
			return
		}
		log.LogAttrs(ctx, slog.LevelWarn, "message left for redelivery", append(attrs, slog.Int("attempts", r.Attempts), slog.Any("error", r.Err))...)
	case DeadLettered, Expired:
		log.LogAttrs(ctx, slog.LevelWarn, "message "+r.Outcome.String(), append(attrs, slog.Int("attempts", r.Attempts), slog.Any("error", r.Err))...)
	}
}
