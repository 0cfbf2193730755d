package idemotel_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/nopstore"
)

// memStore is an inbox in memory, so that the benchmarks measure the
// processor's own work and not a database round trip (the stores have
// their own benchmarks).
type memStore struct {
	nopstore.Store[struct{}]
	mu   sync.Mutex
	keys map[string]bool
}

func (s *memStore) Claim(_ context.Context, _ struct{}, _ string, claims []idemstore.Claim, _ time.Duration) ([]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]bool, len(claims))
	for i, c := range claims {
		out[i] = !s.keys[c.Key]
		s.keys[c.Key] = true
	}
	return out, nil
}

func benchProcessor(b *testing.B, hooks ...idem.Hook) *idem.Processor[struct{}] {
	p, err := idem.NewProcessor[struct{}](&memStore{keys: map[string]bool{}}, &idem.Config[struct{}]{
		Consumer: "bench", Key: idem.ByMessageID, Hooks: hooks,
		Logger:  slog.New(slog.DiscardHandler),
		Horizon: idem.Horizon{Window: 14 * 24 * time.Hour},
		Handler: func(context.Context, struct{}, idem.Message) error { return nil },
	})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func benchMessages(n int) []idem.Message {
	now := time.Now()
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{ID: "evt-" + strconv.Itoa(i), Source: "orders", Time: now, TimeSource: idem.TimeFromHeader,
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	}
	return msgs
}

// BenchmarkProcess measures one fresh message through Process over an
// inbox in memory: untraced is the cost every consumer pays, traced adds a
// recorded span per message (and, for a batch, the batch's).
func BenchmarkProcess(b *testing.B) {
	run := func(b *testing.B, p *idem.Processor[struct{}]) {
		msgs := benchMessages(b.N)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if r := p.Process(ctx, msgs[i]); r.Outcome != idem.Applied {
				b.Fatalf("outcome %v: %v", r.Outcome, r.Err)
			}
		}
	}
	b.Run("untraced", func(b *testing.B) { run(b, benchProcessor(b)) })
	b.Run("traced", func(b *testing.B) { run(b, benchProcessor(b, benchTracer(b))) })
}

// BenchmarkProcessBatch measures batches of 10 fresh messages.
func BenchmarkProcessBatch(b *testing.B) {
	run := func(b *testing.B, p *idem.Processor[struct{}]) {
		msgs := benchMessages(b.N * 10)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			for _, r := range p.ProcessBatch(ctx, msgs[i*10:i*10+10]) {
				if r.Outcome != idem.Applied {
					b.Fatalf("outcome %v: %v", r.Outcome, r.Err)
				}
			}
		}
	}
	b.Run("untraced", func(b *testing.B) { run(b, benchProcessor(b)) })
	b.Run("traced", func(b *testing.B) { run(b, benchProcessor(b, benchTracer(b))) })
}

// benchTracer records every span and exports none: the cost of tracing
// itself, without an exporter's.
func benchTracer(b *testing.B) *idemotel.Tracer {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return idemotel.New(idemotel.RabbitMQ, idemotel.WithTracerProvider(tp))
}
