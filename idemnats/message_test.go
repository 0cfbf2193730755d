package idemnats_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/adaptertest"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/natstest"
)

// The handler sees the producer's identity (Nats-Msg-Id), the event time
// from the most stable source (a UUIDv7 ID's time; else x-event-time;
// else the stream's time), every header (the W3C trace context among
// them), the subject as Key and the stream as Source.
func TestMessageFields(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	stream := uniqueName(t)
	createStreams(t, js, stream)
	d := newDB(t)
	idTime := time.Now().Add(-time.Hour).UTC().Truncate(time.Millisecond)
	v7 := adaptertest.UUIDv7(idTime)
	headerTime := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Second)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range []*nats.Msg{
		{Subject: stream + ".msgs", Data: []byte("a"), Header: nats.Header{"Nats-Msg-Id": {v7}, "traceparent": {traceparent}, idemnats.DefaultTimeHeader: {headerTime.Format(time.RFC3339)}}},
		{Subject: stream + ".msgs", Data: []byte("b"), Header: nats.Header{"Nats-Msg-Id": {"order-2"}, idemnats.DefaultTimeHeader: {headerTime.Format(time.RFC3339)}}},
		{Subject: stream + ".msgs", Data: []byte("c"), Header: nats.Header{"Nats-Msg-Id": {"order-3"}}},
	} {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]idem.Message{}
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		mu.Lock()
		seen[m.ID] = m
		mu.Unlock()
		return write(ctx, tx, m)
	}
	// Confirmed acks: each counts once the server answered it.
	c, err := idemnats.NewConsumer(d.processorWith(t, d.pool, h), &idemnats.Config{URL: srv.URL(), Stream: stream, Logger: quiet, FetchWait: time.Second, ConfirmAcks: true})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitFor(t, 30*time.Second, "3 messages applied", func() bool { return c.Stats().Applied == 3 })
	cons, err := js.Consumer(ctx, stream, "billing-invoice")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := cons.Info(ctx); err != nil || info.NumAckPending != 0 || info.AckFloor.Stream != 3 {
		t.Errorf("consumer info after 3 confirmed acks: %+v (%v); want nothing pending, acked up to 3", info, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	a, b, cm := seen[v7], seen["order-2"], seen["order-3"]
	if a.ID != v7 || a.Headers["traceparent"] != traceparent || a.Key != stream+".msgs" || a.Source != stream || a.Attempt != 1 || a.Redelivered {
		t.Errorf("message a: %+v; want its ID, traceparent, subject as key, stream as source, first attempt", a)
	}
	if a.TimeSource != idem.TimeFromID || !a.Time.Equal(idTime) {
		t.Errorf("message a: time %v from %v; want %v from its UUIDv7 ID", a.Time, a.TimeSource, idTime)
	}
	if b.TimeSource != idem.TimeFromHeader || !b.Time.Equal(headerTime) {
		t.Errorf("message b: time %v from %v; want %v from x-event-time", b.Time, b.TimeSource, headerTime)
	}
	if cm.TimeSource != idem.TimeFromBroker || cm.Time.IsZero() {
		t.Errorf("message c: time %v from %v; want the stream's time", cm.Time, cm.TimeSource)
	}
}

// Cancelling Run while a batch is in the database lets it commit: Run
// returns nil once the batch's acks reached the server (none pending),
// and fetches nothing more.
func TestShutdownFinishesInFlight(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	stream := uniqueName(t)
	createStreams(t, js, stream)
	d := newDB(t)
	ids := publish(t, js, stream, "m", 5)
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if m.ID == ids[2] {
			once.Do(func() { close(reached) })
			<-release
		}
		return write(ctx, tx, m)
	}
	c, err := idemnats.NewConsumer(d.processorWith(t, d.pool, h), &idemnats.Config{
		URL: srv.URL(), Stream: stream, BatchSize: 5, Logger: quiet, FetchWait: time.Second, ShutdownGrace: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never reached the third message")
	}
	publish(t, js, stream, "after", 3)
	// The cancel comes while the batch is in the handler; the batch goes
	// on to its commit.
	cancelRun()
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v; want nil", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60s of its cancel")
	}
	if rows, _ := d.effects(t); rows != 5 {
		t.Errorf("%d effects after the shutdown; want the batch in flight, 5", rows)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, "billing-invoice")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumPending != 3 {
		t.Errorf("after the shutdown: %d unacked, %d never delivered; want 0 and the 3 published later", info.NumAckPending, info.NumPending)
	}
}

// A time header that is not a time, on a message whose ID carries none, is
// bad input: the processor dead-letters it (idem.ErrBadTime), and its dead
// letter carries the envelope idembroker.ReadEnvelope reads, plus the
// subject. The same header beside a UUIDv7 ID is ignored: the ID's time
// wins.
func TestBadEventTimeHeader(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	stream := uniqueName(t)
	createStreams(t, js, stream)
	d := newDB(t)
	v7 := adaptertest.UUIDv7(time.Now().Add(-time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, id := range []string{"bad-1", v7} {
		m := &nats.Msg{Subject: stream + ".msgs", Data: []byte(id), Header: nats.Header{"Nats-Msg-Id": {id}, idemnats.DefaultTimeHeader: {"yesterday"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	c, err := idemnats.NewConsumer(d.processor(t), &idemnats.Config{URL: srv.URL(), Stream: stream, Logger: quiet, FetchWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitFor(t, 60*time.Second, "one applied, one dead-lettered", func() bool { s := c.Stats(); return s.Applied == 1 && s.DeadLettered == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, _ := d.effects(t); rows != 1 {
		t.Errorf("%d effects; want the UUIDv7 message's alone", rows)
	}
	dl, err := js.Stream(ctx, stream+"_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := dl.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	for k, v := range raw.Header {
		h[k] = v[0]
	}
	e := idembroker.ReadEnvelope(h)
	if !strings.Contains(e.Reason, idem.ErrBadTime.Error()) || e.Consumer != "billing-invoice" || e.Outcome != "dead_lettered" || e.Origin != stream+"/1" ||
		h["Nats-Msg-Id"] != "bad-1" || h[idemnats.HeaderSubject] != stream+".msgs" || h[idemnats.DefaultTimeHeader] != "yesterday" {
		t.Errorf("dead letter %+v, headers %v; want the bad time, the consumer, origin %s/1, the ID, the subject and the producer's time header", e, h, stream)
	}
}
