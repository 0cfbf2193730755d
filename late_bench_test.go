package idem

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/bloom"
)

// summaryStore serves pruned-key summaries built in memory, for the
// benchmark of the in-memory check (the claim itself is measured by the
// stores' benchmarks).
type summaryStore struct {
	nopStore
	sums []idemstore.PrunedSummary
}

func (s *summaryStore) PrunedSummaries(context.Context, string) ([]idemstore.PrunedSummary, error) {
	return s.sums, nil
}

func (s *summaryStore) PrunedSummariesIn(context.Context, struct{}, string) ([]idemstore.PrunedSummary, error) {
	return s.sums, nil
}

// BenchmarkLateCheck measures what the late-duplicate check adds to a
// message's preparation: baseline with no summaries, then with 1 and 30
// summaries of a million pruned keys each at the default rate (1e-6), for
// fresh keys (a miss walks every summary: the worst case) of untimed
// messages (the only ones checked) and of timed ones (never checked: the
// horizon proves their markers were not pruned).
func BenchmarkLateCheck(b *testing.B) {
	filters := make([]*bloom.Filter, 30)
	for i := range filters {
		f, err := bloom.New(1_000_000, 1e-6)
		if err != nil {
			b.Fatal(err)
		}
		for k := range 1_000_000 {
			f.Add(fmt.Sprintf("pruned-%d-%d", i, k))
		}
		filters[i] = f
	}
	for _, c := range []struct {
		n     int
		timed bool
	}{{0, false}, {1, false}, {30, false}, {30, true}} {
		n := c.n
		b.Run(fmt.Sprintf("summaries=%d/timed=%v", n, c.timed), func(b *testing.B) {
			st := &summaryStore{}
			for _, f := range filters[:n] {
				st.sums = append(st.sums, idemstore.PrunedSummary{Day: time.Now(), Has: f.Has})
			}
			p, err := NewProcessor[struct{}](st, &Config[struct{}]{Consumer: "x", Key: ByMessageID,
				Logger:  slog.New(slog.DiscardHandler),
				Horizon: Horizon{Window: 14 * 24 * time.Hour},
				Handler: func(context.Context, struct{}, Message) error { return nil }})
			if err != nil {
				b.Fatal(err)
			}
			if err := p.ready(context.Background(), true); err != nil {
				b.Fatal(err)
			}
			msgs := make([]Message, 1024)
			for i := range msgs {
				msgs[i] = Message{ID: fmt.Sprintf("evt-fresh-%d", i), Body: []byte(`{}`)}
				if c.timed {
					msgs[i].Time, msgs[i].TimeSource = time.Now(), TimeFromHeader
				}
			}
			b.ResetTimer()
			for i := range b.N {
				it := p.prepare(msgs[i%len(msgs)])
				p.markLate([]*item{it})
			}
		})
	}
}
