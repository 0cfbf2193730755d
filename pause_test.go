package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// pauseStore is a store that records nothing and keeps one pause, counting
// its reads and its claims.
type pauseStore struct {
	nopStore
	pause  atomic.Pointer[idemstore.Pause]
	reads  atomic.Int64
	claims atomic.Int64
}

func (s *pauseStore) Paused(context.Context, string) (idemstore.Pause, error) {
	s.reads.Add(1)
	if p := s.pause.Load(); p != nil {
		return *p, nil
	}
	return idemstore.Pause{}, nil
}

func (s *pauseStore) PausedIn(ctx context.Context, _ struct{}, c string) (idemstore.Pause, error) {
	return s.Paused(ctx, c)
}

func (s *pauseStore) Claim(ctx context.Context, tx struct{}, consumer string, claims []idemstore.Claim, lt time.Duration) ([]bool, error) {
	s.claims.Add(1)
	return s.nopStore.Claim(ctx, tx, consumer, claims, lt)
}

// A paused consumer claims nothing and runs no handler: every message
// comes back as a blameless Retry wrapping ErrPaused, held without
// spending an attempt; the health state says who paused it, since when
// and why, and stays ready; a message acked after the resume clears it.
// The pause is read at most once per PauseTTL.
func TestPausedProcessHoldsAndClaimsNothing(t *testing.T) {
	st := &pauseStore{}
	since := time.Now().Add(-time.Minute).Truncate(time.Second)
	st.pause.Store(&idemstore.Pause{Paused: true, Since: since, By: "alice", Why: "incident 42"})
	var ran atomic.Int64
	p, err := NewProcessor[struct{}](st, &Config[struct{}]{Consumer: "billing", Key: ByMessageID, Logger: slog.New(slog.DiscardHandler),
		Handler: func(context.Context, struct{}, Message) error { ran.Add(1); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Check(context.Background()); err != nil {
		t.Fatalf("Check refused a paused consumer: %v", err)
	}
	st.claims.Store(0) // Check's claim is rolled back
	for i := range 50 {
		r := p.Process(context.Background(), Message{ID: fmt.Sprint("m", i)})
		d := p.Dispose(r)
		if r.Outcome != Retry || !r.Blameless || !errors.Is(r.Err, ErrPaused) || r.Attempts != 0 || d.Action != ActionHold || d.Delay != PauseHoldDelay {
			t.Fatalf("paused: %+v → %+v", r, d)
		}
		// The health (idembroker.HealthState) reads who, when and why from it.
		if pe := (*PausedError)(nil); !errors.As(r.Err, &pe) || !pe.Since.Equal(since) || pe.By != "alice" || pe.Why != "incident 42" {
			t.Fatalf("paused: the error %v does not carry the pause", r.Err)
		}
	}
	if st.claims.Load() != 0 || ran.Load() != 0 {
		t.Fatalf("paused: %d claims, handler ran %d times", st.claims.Load(), ran.Load())
	}
	if n := st.reads.Load(); n > 2 {
		t.Fatalf("the pause was read %d times for 50 messages within %v", n, PauseTTL)
	}

	st.pause.Store(nil)
	deadline := time.Now().Add(time.Minute)
	var r Result
	for r = p.Process(context.Background(), Message{ID: "m0"}); r.Outcome != Applied; r = p.Process(context.Background(), Message{ID: "m0"}) {
		if time.Now().After(deadline) {
			t.Fatalf("still held a minute after the resume: %+v", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkPauseCheckOverhead measures what checking the pause adds to a
// batch in the processor alone, over a store that does nothing: with a
// store that keeps pauses (read once per PauseTTL, an atomic load between)
// and without.
func BenchmarkPauseCheckOverhead(b *testing.B) {
	for _, pausable := range []bool{false, true} {
		b.Run(fmt.Sprintf("pausable=%v", pausable), func(b *testing.B) {
			var st idemstore.Store[struct{}] = nopStore{}
			if pausable {
				st = &pauseStore{}
			}
			p, err := NewProcessor[struct{}](st, &Config[struct{}]{Consumer: "x", Key: ByMessageID, Logger: slog.New(slog.DiscardHandler),
				Handler: func(context.Context, struct{}, Message) error { return nil }})
			if err != nil {
				b.Fatal(err)
			}
			msgs := make([]Message, 10)
			for i := range msgs {
				msgs[i] = Message{ID: fmt.Sprint("m", i)}
			}
			for b.Loop() {
				p.ProcessBatch(context.Background(), msgs)
			}
		})
	}
}

// BenchmarkCheckPause measures the check a batch makes between reads of
// the pause (two atomic loads; the clock is read once for it and the
// settings), next to the same call on a store without pauses.
func BenchmarkCheckPause(b *testing.B) {
	for _, pausable := range []bool{false, true} {
		b.Run(fmt.Sprintf("pausable=%v", pausable), func(b *testing.B) {
			var st idemstore.Store[struct{}] = nopStore{}
			if pausable {
				st = &pauseStore{}
			}
			p, err := NewProcessor[struct{}](st, &Config[struct{}]{Consumer: "x", Key: ByMessageID, Logger: slog.New(slog.DiscardHandler),
				Handler: func(context.Context, struct{}, Message) error { return nil }})
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now().UnixNano() // the clock is readyIn's, read once for both checks
			for b.Loop() {
				if err := p.checkPause(context.Background(), nil, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
