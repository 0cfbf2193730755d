package natspub_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/idembroker"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/internal/natstest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/natspub"
)

func setup(t *testing.T) (jetstream.JetStream, *natspub.Publisher) {
	t.Helper()
	s := natstest.Start(t)
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	p, err := natspub.New(js, nil)
	if err != nil {
		t.Fatal(err)
	}
	return js, p
}

func stream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Records reach the stream with their ID in Nats-Msg-Id and their event
// time, in order per key; a record published again (its PubAck lost) is
// dropped by the stream's dedupe.
func TestPublish(t *testing.T) {
	t.Parallel()
	js, p := setup(t)
	s := stream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	at := time.Date(2026, 9, 1, 2, 14, 11, 0, time.UTC)
	recs := []outbox.Record{
		{ID: "id-1", Destination: "orders.created", Key: "a", Body: []byte("1"), EventTime: at, Headers: map[string]string{"traceparent": "00-x"}},
		{ID: "id-2", Destination: "orders.created", Key: "a", Body: []byte("2"), EventTime: at},
		{ID: "id-3", Destination: "orders.created", Key: "b", Body: []byte("3"), EventTime: at},
	}
	ctx := context.Background()
	for _, err := range p.Publish(ctx, recs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, err := range p.Publish(ctx, recs[:1]) {
		if err != nil {
			t.Fatal(err)
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("stream holds %d messages; want 3 (the republished record dropped by its Nats-Msg-Id)", info.State.Msgs)
	}
	var order []string
	for seq := uint64(1); seq <= 3; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, m.Header.Get(jetstream.MsgIDHeader))
		if seq == 1 {
			if got := m.Header.Get(idembroker.HeaderEventTime); got != at.Format(time.RFC3339Nano) {
				t.Errorf("event time header %q; want %q", got, at.Format(time.RFC3339Nano))
			}
			if got := m.Header.Get("traceparent"); got != "00-x" {
				t.Errorf("traceparent %q; want the caller's header kept", got)
			}
		}
	}
	if order[0] != "id-1" || order[1] != "id-2" && order[2] != "id-2" {
		t.Errorf("stream order %v; want id-1 before id-2 (key a)", order)
	}
}

// A stream whose duplicate window is shorter than MinDuplicateWindow is
// refused with both numbers, and retried (not parked); a subject no stream
// captures is refused, and the key's later record not attempted.
func TestRefusals(t *testing.T) {
	t.Parallel()
	js, p := setup(t)
	stream(t, js, jetstream.StreamConfig{Name: "SHORT", Subjects: []string{"short"}, Duplicates: time.Second})
	errs := p.Publish(context.Background(), []outbox.Record{
		{ID: "1", Destination: "short", Key: "k"},
		{ID: "2", Destination: "nowhere", Key: "x"},
		{ID: "3", Destination: "nowhere", Key: "x"},
	})
	if !errors.Is(errs[0], natspub.ErrStreamUnsafe) || outbox.IsRefused(errs[0]) {
		t.Errorf("short window: %v; want ErrStreamUnsafe, not refused (the relay retries it)", errs[0])
	} else {
		t.Logf("refused: %v", errs[0])
	}
	if !outbox.IsRefused(errs[1]) {
		t.Errorf("no stream: %v; want refused", errs[1])
	}
	if !errors.Is(errs[2], outbox.ErrNotAttempted) {
		t.Errorf("after its key failed: %v; want ErrNotAttempted", errs[2])
	}
}
