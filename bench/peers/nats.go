package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
)

func init() { brokers["nats"] = NATS }

// NATS is the broker of JetStream streams on file storage with one
// durable pull consumer of explicit acks: a real server when -nats names
// one, else an embedded nats-server.
func NATS() *Broker {
	return &Broker{
		Name:    "nats",
		Prepare: prepareStream,
		Consumers: []Consumer{
			{Key: "naive", Name: "naive batched (no guard)", Run: natsBatches(NaiveBatch)},
			{Key: "handrolled-msg", Name: "inbox SQL by hand, per message", Guarded: true, Run: natsHandOne},
			{Key: "handrolled-batch", Name: "hand-rolled batched inbox", Guarded: true, Run: natsBatches(HandBatch)},
			{Key: "watermill", Name: "Watermill router + inbox SQL in its handler", Guarded: true, Run: watermillNATS},
			{Key: "idem-msg", Name: "idem per message (Handler)", Guarded: true, Run: natsIdem(false)},
			{Key: "idem-batch", Name: "idem batched (HandleBatch)", Guarded: true, Run: natsIdem(true)},
		},
	}
}

// natsIDHeader carries the message ID of the workload. Not Nats-Msg-Id:
// the stream's publish dedupe would drop the redeliveries the workload
// mixes in, which a consumer meets as redeliveries after a lost ack.
const natsIDHeader = "x-message-id"

// natsFetchWait is how long a fetch of every consumer here waits for a
// first message when the durable has none, so that the tail of a run is
// not a wait.
const natsFetchWait = 20 * time.Millisecond

// embedded is the NATS server of a process without -nats, started by the
// first run that needs it and kept for the next ones, until stopNATS.
var embedded struct {
	mu  sync.Mutex
	srv *server.Server
	dir string
}

// natsURL returns url, or the embedded server's URL when url is empty.
func natsURL(url string) (string, error) {
	if url != "" {
		return url, nil
	}
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	if embedded.srv != nil {
		return embedded.srv.ClientURL(), nil
	}
	dir, err := os.MkdirTemp("", "peers-nats-")
	if err != nil {
		return "", err
	}
	// Port -1: a free one. SyncAlways: a PubAck means the message is on
	// disk, as RabbitMQ's quorum queues and Kafka's all-ISR acks promise.
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true, SyncAlways: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("starting an embedded nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		_ = os.RemoveAll(dir)
		return "", errors.New("the embedded nats-server did not accept connections within 30s")
	}
	embedded.srv, embedded.dir = srv, dir
	return srv.ClientURL(), nil
}

// stopNATS shuts down the embedded server, if one runs, and removes its
// store.
func stopNATS() {
	embedded.mu.Lock()
	defer embedded.mu.Unlock()
	if embedded.srv == nil {
		return
	}
	embedded.srv.Shutdown()
	embedded.srv.WaitForShutdown()
	_ = os.RemoveAll(embedded.dir)
	embedded.srv, embedded.dir = nil, ""
}

// natsVersion is the server's version.
func natsVersion(url string) string {
	if url == "" {
		return "embedded nats-server " + server.VERSION
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return ""
	}
	defer nc.Close()
	return nc.ConnectedServerVersion()
}

// jsConnect connects to the server at url.
func jsConnect(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to NATS at %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// prepareStream creates a fresh stream named run on the subject run.msgs
// and publishes w to it, waiting for every PubAck, the ID in the header
// the consumers read it from.
func prepareStream(ctx context.Context, opts *Options, run string, w *Workload) (string, func(), error) {
	url, err := natsURL(opts.NATSURL)
	if err != nil {
		return "", nil, err
	}
	nc, js, err := jsConnect(url)
	if err != nil {
		return "", nil, err
	}
	defer nc.Close()
	// A day's retention: shorter than the inbox window, as idemnats
	// requires (a replay cannot reach past the horizon).
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: run, Subjects: []string{run + ".msgs"}, Storage: jetstream.FileStorage,
		MaxAge: 24 * time.Hour}); err != nil {
		return "", nil, fmt.Errorf("creating stream %s: %w", run, err)
	}
	cleanup := func() {
		nc, js, err := jsConnect(url)
		if err != nil {
			return
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, run)
		_ = js.DeleteStream(ctx, run+"_DLQ")
	}
	for i := 0; i < len(w.Msgs); {
		var fs []jetstream.PubAckFuture
		for ; i < len(w.Msgs) && len(fs) < 1000; i++ {
			m := w.Msgs[i]
			msg := &nats.Msg{Subject: run + ".msgs", Data: m.Body, Header: nats.Header{}}
			msg.Header.Set(natsIDHeader, m.ID)
			// Watermill's marshaler reads a message's UUID from this header.
			msg.Header.Set("_watermill_message_uuid", m.ID)
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				cleanup()
				return "", nil, err
			}
			fs = append(fs, f)
		}
		for _, f := range fs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				cleanup()
				return "", nil, fmt.Errorf("publishing to %s: %w", run, err)
			case <-ctx.Done():
				cleanup()
				return "", nil, ctx.Err()
			}
		}
	}
	return run, cleanup, nil
}

// natsDurable creates e's durable pull consumer on e's stream, as
// idemnats creates its own: explicit acks, no MaxDeliver, MaxAckPending
// the prefetch.
func natsDurable(ctx context.Context, e *Env) (*nats.Conn, jetstream.Consumer, error) {
	url, err := natsURL(e.NATSURL)
	if err != nil {
		return nil, nil, err
	}
	nc, js, err := jsConnect(url)
	if err != nil {
		return nil, nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, e.Source, jetstream.ConsumerConfig{Durable: "peers",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: e.Prefetch})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, cons, nil
}

// natsFetch returns up to n messages: what the durable has at once, or
// the first to come within natsFetchWait and what came with it.
func natsFetch(ctx context.Context, cons jetstream.Consumer, n int) ([]jetstream.Msg, error) {
	b, err := cons.FetchNoWait(n)
	msgs, err := natsDrain(b, err)
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	fctx, cancel := context.WithTimeout(ctx, natsFetchWait)
	defer cancel()
	b, err = cons.Fetch(n, jetstream.FetchContext(fctx))
	msgs, err = natsDrain(b, err)
	if fctx.Err() != nil {
		err = nil
	}
	return msgs, err
}

func natsDrain(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for m := range b.Messages() {
		msgs = append(msgs, m)
	}
	return msgs, b.Error()
}

func natsMsg(m jetstream.Msg) Msg {
	return Msg{ID: m.Headers().Get(natsIDHeader), Body: m.Data()}
}

// natsBatches is a hand-written batching consumer: a fetch of up to
// e.Batch messages, one call of apply, then an ack of each message, after
// the commit.
func natsBatches(apply func(context.Context, *pgxpool.Pool, string, []Msg) error) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		nc, cons, err := natsDurable(ctx, e)
		if err != nil {
			return err
		}
		defer nc.Close()
		batch := make([]Msg, 0, e.Batch)
		for ctx.Err() == nil {
			ms, err := natsFetch(ctx, cons, e.Batch)
			if err != nil {
				return stopped(ctx, err)
			}
			if len(ms) == 0 {
				continue
			}
			batch = batch[:0]
			for _, m := range ms {
				batch = append(batch, natsMsg(m))
			}
			if err := apply(ctx, e.Pool, e.Consumer, batch); err != nil {
				return stopped(ctx, err)
			}
			for _, m := range ms {
				if err := m.Ack(); err != nil {
					return stopped(ctx, err)
				}
			}
			e.Acked(len(ms))
		}
		return nil
	}
}

// natsHandOne is the per-message consumer: the inbox SQL by hand, then
// the message's own ack.
func natsHandOne(ctx context.Context, e *Env) error {
	nc, cons, err := natsDurable(ctx, e)
	if err != nil {
		return err
	}
	defer nc.Close()
	for ctx.Err() == nil {
		ms, err := natsFetch(ctx, cons, e.Batch)
		if err != nil {
			return stopped(ctx, err)
		}
		for _, m := range ms {
			if err := HandOne(ctx, e.Pool, e.Consumer, natsMsg(m)); err != nil {
				return stopped(ctx, err)
			}
			if err := m.Ack(); err != nil {
				return stopped(ctx, err)
			}
			e.Acked(1)
		}
	}
	return nil
}

// natsIdem is idemnats with the effect through idem.JSON (batch 1) or
// idem.JSONBatch (batches of e.Batch).
func natsIdem(batched bool) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		proc, err := Processor(e.Store, e.Consumer, batched)
		if err != nil {
			return err
		}
		url, err := natsURL(e.NATSURL)
		if err != nil {
			return err
		}
		batch := 1
		if batched {
			batch = e.Batch
		}
		c, err := idemnats.NewConsumer(proc, &idemnats.Config{URL: url, Stream: e.Source, Durable: "peers",
			IDHeader: natsIDHeader, BatchSize: batch, MaxAckPending: e.Prefetch, FetchWait: natsFetchWait,
			CreateDeadLetterStream: true, Hooks: []idem.Hook{settled{e}}, Logger: quiet})
		if err != nil {
			return err
		}
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
}
