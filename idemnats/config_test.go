package idemnats_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/natstest"
	"github.com/idemkit/idem/pgxinbox"
)

// An AckWait not longer than two heartbeats is refused at construction,
// naming both numbers.
func TestNewConsumerRefusesShortAckWait(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	_, err := idemnats.NewConsumer(d.processor(t), &idemnats.Config{URL: "nats://127.0.0.1:1", Stream: "S", AckWait: 3 * time.Second, Heartbeat: 2 * time.Second})
	if !errors.Is(err, idemnats.ErrConfig) {
		t.Fatalf("NewConsumer = %v; want ErrConfig", err)
	}
	for _, want := range []string{"ack wait 3s", "processing budget 4s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// Run refuses a durable that would discard messages (MaxDeliver set) or
// count them settled before they commit (no explicit acks), or whose
// AckWait is shorter than the processing budget, naming the numbers;
// nothing is fetched.
func TestRunRefusesUnsafeDurable(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	for _, tc := range []struct {
		name string
		cc   jetstream.ConsumerConfig
		want []string
	}{
		{"MaxDeliver", jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, AckWait: 30 * time.Second}, []string{"MaxDeliver 5", "2m30s"}},
		{"AckNone", jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy}, []string{"AckPolicy AckNone"}},
		{"ShortAckWait", jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second}, []string{"ack wait 1s", "processing budget 4s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := uniqueName(t)
			createStreams(t, js, stream)
			publish(t, js, stream, "m", 1)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			tc.cc.Durable = "billing-invoice"
			if _, err := js.CreateConsumer(ctx, stream, tc.cc); err != nil {
				t.Fatal(err)
			}
			d := newDB(t)
			c, err := idemnats.NewConsumer(d.processor(t), &idemnats.Config{URL: srv.URL(), Stream: stream, Heartbeat: 2 * time.Second, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			err = c.Run(ctx)
			if !errors.Is(err, idemnats.ErrConfig) {
				t.Fatalf("Run = %v; want ErrConfig", err)
			}
			t.Logf("refused: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q", w)
				}
			}
			if rows, _ := d.effects(t); rows != 0 || c.Stats().Delivered != 0 {
				t.Errorf("a refused consumer fetched %d messages and applied %d", c.Stats().Delivered, rows)
			}
		})
	}
}

// A missing stream is refused at once; a missing dead-letter stream is
// created when allowed, with the stream's storage, and the durable with
// explicit acks and no MaxDeliver.
func TestRunCreatesDurableAndDeadLetterStream(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := newDB(t)
	c, err := idemnats.NewConsumer(d.processor(t), &idemnats.Config{URL: srv.URL(), Stream: "NO_SUCH_STREAM", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("Run = %v on a missing stream; want ErrStreamNotFound", err)
	}

	stream := uniqueName(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".msgs"}, Storage: jetstream.FileStorage, MaxAge: testMaxAge}); err != nil {
		t.Fatal(err)
	}
	publish(t, js, stream, "m", 3)
	c, err = idemnats.NewConsumer(d.processor(t), &idemnats.Config{URL: srv.URL(), Stream: stream, CreateDeadLetterStream: true, Logger: quiet, FetchWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitFor(t, 30*time.Second, "3 messages applied", func() bool { return c.Stats().Applied == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dl, err := js.Stream(ctx, stream+"_DLQ")
	if err != nil {
		t.Fatalf("dead-letter stream: %v", err)
	}
	if cfg := dl.CachedInfo().Config; cfg.Storage != jetstream.FileStorage || len(cfg.Subjects) != 1 || cfg.Subjects[0] != "idem.dlq."+stream {
		t.Errorf("dead-letter stream config %+v; want file storage on idem.dlq.%s", cfg, stream)
	}
	cons, err := js.Consumer(ctx, stream, "billing-invoice")
	if err != nil {
		t.Fatal(err)
	}
	if cc := cons.CachedInfo().Config; cc.AckPolicy != jetstream.AckExplicitPolicy || cc.MaxDeliver > 0 || cc.AckWait != 30*time.Second {
		t.Errorf("durable created as %+v; want explicit acks, no MaxDeliver, AckWait 30s", cc)
	}
}

// A 1-hour inbox in front of a stream that keeps messages 7 days is
// refused at start, naming both numbers, as is one in front of a
// dead-letter stream that keeps them for ever; AcceptReplayPastWindow
// lets it run.
func TestRunRefusesRetentionBeyondWindow(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	d := newDB(t)
	store, err := pgxinbox.New(d.pool, &pgxinbox.Config{Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{Consumer: "billing-invoice", Key: idem.ByMessageID, Handler: write, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	create := func(sc jetstream.StreamConfig) {
		t.Helper()
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatalf("creating stream %s: %v", sc.Name, err)
		}
	}
	week := uniqueName(t)
	create(jetstream.StreamConfig{Name: week, Subjects: []string{week + ".msgs"}, MaxAge: 7 * 24 * time.Hour})
	create(jetstream.StreamConfig{Name: week + "_DLQ", Subjects: []string{"idem.dlq." + week}, MaxAge: time.Hour})
	forever := uniqueName(t)
	create(jetstream.StreamConfig{Name: forever, Subjects: []string{forever + ".msgs"}, MaxAge: 30 * time.Minute})
	create(jetstream.StreamConfig{Name: forever + "_DLQ", Subjects: []string{"idem.dlq." + forever}})
	for _, tc := range []struct {
		stream string
		want   []string
	}{
		{week, []string{"stream " + week + " keeps messages 168h0m0s", "the inbox window is 1h0m0s"}},
		{forever, []string{"dead-letter stream " + forever + "_DLQ keeps messages for ever (MaxAge 0)", "the inbox window is 1h0m0s"}},
	} {
		c, err := idemnats.NewConsumer(proc, &idemnats.Config{URL: srv.URL(), Stream: tc.stream, Logger: quiet, FetchWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		err = c.Run(ctx)
		if !errors.Is(err, idemnats.ErrConfig) {
			t.Fatalf("Run on %s = %v; want ErrConfig", tc.stream, err)
		}
		for _, want := range tc.want {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}
	if rows, _ := d.effects(t); rows != 0 {
		t.Errorf("%d effects after the refusals; want none", rows)
	}

	publish(t, js, week, "m", 3)
	c, err := idemnats.NewConsumer(proc, &idemnats.Config{URL: srv.URL(), Stream: week, Logger: quiet, FetchWait: time.Second, AcceptReplayPastWindow: true})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitFor(t, 60*time.Second, "3 messages applied on the accepted stream", func() bool { return c.Stats().Applied == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != 3 || distinct != 3 {
		t.Errorf("%d effects (%d distinct); want 3", rows, distinct)
	}
}
