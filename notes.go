package idem

import (
	"errors"
	"log/slog"
	"sync"
	"time"
)

// noteInterval is how often a processor logs a summary of what it sees too
// often to log one line for each: duplicates skipped, untimed messages,
// event times in the future.
const noteInterval = time.Minute

// notes keeps the counts behind those summaries. Each is logged on the
// first occurrence and then at most once per noteInterval, with the count
// since the last line, so a run of 100,000 redeliveries prints a handful of
// lines instead of 100,000.
type notes struct {
	mu                                    sync.Mutex
	dups, untimedN, futureN, lateN, heldN summary
}

type summary struct {
	count  int64
	oldest time.Duration // duplicates: the age of the oldest first delivery
	last   time.Time     // when the last line was logged
}

// due counts one occurrence and reports whether a line is due, and how
// many occurrences it stands for.
func (s *summary) due(now time.Time) (int64, bool) {
	s.count++
	if !s.last.IsZero() && now.Sub(s.last) < noteInterval {
		return 0, false
	}
	n := s.count
	s.count, s.last = 0, now
	return n, true
}

func (n *notes) duplicate(log *slog.Logger, consumer string, age time.Duration) {
	n.mu.Lock()
	if age > n.dups.oldest {
		n.dups.oldest = age
	}
	count, due := n.dups.due(time.Now())
	oldest := n.dups.oldest
	if due {
		n.dups.oldest = 0
	}
	n.mu.Unlock()
	if due {
		log.Info("duplicates skipped", "consumer", consumer, "count", count, "oldest_first_age", oldest.Round(time.Second))
	}
}

func (n *notes) untimed(log *slog.Logger, consumer, id string) {
	n.mu.Lock()
	count, due := n.untimedN.due(time.Now())
	n.mu.Unlock()
	if due {
		log.Warn("messages without an event time: their markers are kept a window after they were written, and a replay after that cannot be told from a new message",
			"consumer", consumer, "count", count, "example_message_id", id)
	}
}

func (n *notes) future(log *slog.Logger, consumer, id string, t time.Time, maxAhead time.Duration) {
	n.mu.Lock()
	count, due := n.futureN.due(time.Now())
	n.mu.Unlock()
	if due {
		log.Warn("event times further in the future than Horizon.MaxAhead: treated as untimed (is a producer's clock wrong?)",
			"consumer", consumer, "count", count, "example_message_id", id, "event_time", t, "max_ahead", maxAhead)
	}
}

func (n *notes) held(log *slog.Logger, consumer string, r Result) {
	n.mu.Lock()
	count, due := n.heldN.due(time.Now())
	n.mu.Unlock()
	if !due {
		return
	}
	msg := "messages held: not their fault, not applied, retried without spending their attempts"
	if errors.Is(r.Err, ErrMisconfigured) || errors.Is(r.Err, ErrConfig) || errors.Is(r.Err, ErrInboxNotReady) {
		msg = "messages held: the inbox is not set up for this consumer (run: idem inbox migrate; check the role's grants and the stored window: idem inbox window show)"
	}
	log.Warn(msg, "consumer", consumer, "count", count, "example_message_id", r.MessageID, "error", r.Err)
}
