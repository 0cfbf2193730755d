package idemnats_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/adaptertest"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/natstest"
)

// The adapter conformance suite against a real, embedded JetStream
// server: every check every broker adapter passes.
func TestConformance(t *testing.T) {
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	adaptertest.Run(t, &conformanceHarness{url: srv.URL(), js: js, dead: map[string]*deadLog{}})
}

// conformanceHarness gives the suite a stream and its dead-letter stream
// per topic, and consumers built with NewConsumer on one durable per
// stream.
type conformanceHarness struct {
	url  string
	js   jetstream.JetStream
	mu   sync.Mutex
	dead map[string]*deadLog // stream → dead letters read
}

// deadLog is what was read of a dead-letter stream: the letters, and the
// last sequence read of the stream as it is now (a restored stream starts
// again at 1).
type deadLog struct {
	letters []adaptertest.DeadLetter
	last    uint64
}

func (h *conformanceHarness) Features() adaptertest.Features {
	return adaptertest.Features{
		// One consumer fetching one batch at a time.
		Ordered:                    true,
		ErrNoDeadLetterDestination: idemnats.ErrNoDeadLetterDestination,
		StopWithin:                 5 * time.Second,
	}
}

func (h *conformanceHarness) Topic(t testing.TB) string {
	t.Helper()
	name := uniqueName(t)
	createStreams(t, h.js, name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{name, name + "_DLQ"} {
			if err := h.js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Logf("deleting stream %s: %v", s, err)
			}
		}
	})
	return name
}

func (h *conformanceHarness) Publish(t testing.TB, stream string, msgs ...adaptertest.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, m := range msgs {
		nm := &nats.Msg{Subject: stream + ".msgs", Data: m.Body, Header: nats.Header{}}
		if m.ID != "" {
			nm.Header.Set(testIDHeader, m.ID)
		}
		if !m.EventTime.IsZero() {
			nm.Header.Set(idemnats.DefaultTimeHeader, m.EventTime.UTC().Format(time.RFC3339Nano))
		}
		if _, err := h.js.PublishMsg(ctx, nm); err != nil {
			t.Fatalf("publishing to %s: %v", stream, err)
		}
	}
}

// conformanceConsumer is a Consumer whose connection the suite can cut.
type conformanceConsumer struct {
	*idemnats.Consumer[pgx.Tx]
}

func (c conformanceConsumer) Cut() bool { return c.DropConnection() }

func (h *conformanceHarness) Consumer(t testing.TB, stream string, proc *idem.Processor[pgx.Tx], opts adaptertest.ConsumerOptions) adaptertest.Consumer {
	t.Helper()
	cfg := &idemnats.Config{
		URL:    h.url,
		Stream: stream,
		// Redelivery after a crash comes after AckWait.
		AckWait:       4 * time.Second,
		BatchSize:     opts.BatchSize,
		FetchWait:     time.Second,
		IDHeader:      testIDHeader,
		Backoff:       idem.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		ShutdownGrace: time.Second,
		Logger:        opts.Logger,
	}
	if opts.NoDeadLetterDestination {
		cfg.DeadLetterStream = stream + "_NO_SUCH_DLQ"
	}
	if opts.CrashBeforeAck {
		var once sync.Once
		cfg.Faults = func(_ context.Context, point idem.FaultPoint, _ []idem.Message) (err error) {
			if point == idemnats.BeforeSettle {
				once.Do(func() { err = errors.New("process died between commit and ack") })
			}
			return err
		}
	}
	c, err := idemnats.NewConsumer(proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return conformanceConsumer{c}
}

func (h *conformanceHarness) DeadLetters(t testing.TB, stream string) []adaptertest.DeadLetter {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log := h.dead[stream]
	if log == nil {
		log = &deadLog{}
		h.dead[stream] = log
	}
	s, err := h.js.Stream(ctx, stream+"_DLQ")
	if err != nil {
		t.Fatalf("reading %s_DLQ: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("reading %s_DLQ: %v", stream, err)
	}
	for seq := log.last + 1; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("reading %s_DLQ #%d: %v", stream, seq, err)
		}
		dl := adaptertest.DeadLetter{ID: m.Header.Get(testIDHeader), Body: m.Data, Headers: map[string]string{}}
		for k, v := range m.Header {
			if len(v) > 0 {
				dl.Headers[k] = v[0]
			}
		}
		log.letters = append(log.letters, dl)
		log.last = seq
	}
	return append([]adaptertest.DeadLetter(nil), log.letters...)
}

func (h *conformanceHarness) DropDeadLetters(t testing.TB, stream string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.js.DeleteStream(ctx, stream+"_DLQ"); err != nil {
		t.Fatalf("deleting %s_DLQ: %v", stream, err)
	}
}

func (h *conformanceHarness) RestoreDeadLetters(t testing.TB, stream string) {
	t.Helper()
	h.mu.Lock()
	if log := h.dead[stream]; log != nil {
		log.last = 0
	}
	h.mu.Unlock()
	createDeadLetterStream(t, h.js, stream)
}
