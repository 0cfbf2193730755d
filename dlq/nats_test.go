package dlq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/natstest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// natsEnv is a JetStream stream ORDERS (orders.>) with its dead-letter
// stream ORDERS_DLQ, an inbox in a fresh schema and an effects table.
type natsEnv struct {
	t     *testing.T
	url   string
	js    jetstream.JetStream
	store *pgxinbox.Store
	pool  *pgxpool.Pool
}

func newNATSEnv(t *testing.T, ctx context.Context) *natsEnv {
	t.Helper()
	srv := natstest.Start(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range []jetstream.StreamConfig{
		// The shortest duplicate window JetStream takes: a redrive is
		// deduped against the original until it has passed.
		{Name: "ORDERS", Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage, MaxAge: 24 * time.Hour, Duplicates: 100 * time.Millisecond},
		// A duplicate window of an hour, which a redrive meets.
		{Name: "LONG", Subjects: []string{"long.>"}, Storage: jetstream.FileStorage, MaxAge: 24 * time.Hour, Duplicates: time.Hour},
		{Name: "ORDERS_DLQ", Subjects: []string{"idem.dlq.ORDERS"}, Storage: jetstream.FileStorage, MaxAge: 24 * time.Hour},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatalf("creating stream %s: %v", sc.Name, err)
		}
	}
	pool := pgtest.PoolOf(t, 0)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &natsEnv{t: t, url: srv.URL(), js: js, store: store, pool: pool}
}

// publish publishes a message to orders.msgs with its ID in Nats-Msg-Id.
func (e *natsEnv) publish(ctx context.Context, id string) {
	e.t.Helper()
	if _, err := e.js.Publish(ctx, "orders.msgs", []byte(`{"order":"`+id+`"}`), jetstream.WithMsgID(id)); err != nil {
		e.t.Fatal(err)
	}
}

// consume runs an idemnats consumer of ORDERS until until() holds.
func (e *natsEnv) consume(ctx context.Context, broken bool, until func(*outcomes) bool) *outcomes {
	e.t.Helper()
	o := &outcomes{}
	proc, err := idem.NewProcessor(e.store, &idem.Config[pgx.Tx]{
		Consumer: "orders-ship", Key: idem.ByMessageID, Hooks: []idem.Hook{o},
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			if broken {
				return idem.Permanent(errors.New("carrier unknown for order " + m.ID))
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
			return err
		},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := idemnats.NewConsumer(proc, &idemnats.Config{URL: e.url, Stream: "ORDERS", FetchWait: 200 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(rctx) }()
	for !until(o) {
		select {
		case err := <-errc:
			stop()
			e.t.Fatalf("consumer stopped: %v", err)
		case <-ctx.Done():
			stop()
			e.t.Fatalf("consumer: %d outcomes when the test timed out", o.count())
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	if err := <-errc; err != nil {
		e.t.Fatalf("consumer: %v", err)
	}
	return o
}

func (e *natsEnv) effects(ctx context.Context, id string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE message_id = $1`, id).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// The JetStream round: a consumer whose handler fails permanently fills
// the dead-letter stream; list groups the letters and show judges one,
// reading without consuming; a redrive is sent and deleted once the
// origin stream's duplicate window has passed, and the fixed consumer
// applies each message exactly once; a redrive inside a window is refused
// and the letter stays; purge deletes letters without sending them.
func TestNATSListShowRedrivePurge(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newNATSEnv(t, ctx)
	ids := []string{"ord-1", "ord-2", "ord-3"}
	for _, id := range ids {
		e.publish(ctx, id)
	}
	src, err := NewNATS(ctx, NATSConfig{URL: e.url, Stream: "ORDERS_DLQ"})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var mu sync.Mutex
	peekN := func() int {
		mu.Lock()
		defer mu.Unlock()
		ls, err := src.Peek(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(ls)
	}
	e.consume(ctx, true, func(*outcomes) bool { return peekN() == 3 })

	ls, err := List(ctx, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Total != 3 || len(ls.Groups) != 1 || ls.Groups[0].Consumer != "orders-ship" || !strings.Contains(ls.Groups[0].Reason, "carrier unknown for order <id>") {
		t.Fatalf("listing %+v", ls)
	}
	sh, err := Show(ctx, src, nil, "ord-2")
	if err != nil {
		t.Fatal(err)
	}
	if sh.Judgement.Verdict != Unknown || sh.Letter.Target != "orders.msgs" || sh.Letter.Position != "#2" || !strings.HasPrefix(sh.Letter.Origin, "ORDERS/") ||
		string(sh.Letter.Body) != `{"order":"ord-2"}` || sh.Letter.TimeSource != idem.TimeFromHeader {
		t.Fatalf("show without inbox %+v", sh)
	}
	// Reading consumed nothing: the stream still holds the three.
	if n := peekN(); n != 3 {
		t.Fatalf("%d letters after reading; want 3", n)
	}
	in, err := NewInbox(e.pool, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	if sh, err = Show(ctx, src, in, "ord-2"); err != nil || sh.Judgement.Verdict != Apply {
		t.Fatalf("show %+v %v", sh.Judgement, err)
	}
	res, err := Redrive(ctx, src, in, Selection{})
	if err != nil || res.Matched != 3 || res.Done != 0 || peekN() != 3 {
		t.Fatalf("dry run %+v %v", res, err)
	}

	// Once ORDERS' duplicate window has passed since the original was
	// published, the redrive goes through; until then it is refused and
	// the letter stays.
	for {
		res, err = Redrive(ctx, src, in, Selection{Filter: Filter{IDs: []string{"ord-2"}}, Apply: true})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "duplicate window") || ctx.Err() != nil {
			t.Fatalf("redrive of ord-2: %v", err)
		}
		if n := peekN(); n != 3 {
			t.Fatalf("%d letters after a refused redrive; want 3", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res.Matched != 1 || res.Done != 1 || !res.Items[0].Sent {
		t.Fatalf("redrive of ord-2 %+v", res)
	}
	if n := peekN(); n != 2 {
		t.Fatalf("%d letters after redriving one; want 2", n)
	}
	res, err = Redrive(ctx, src, in, Selection{Filter: Filter{IDs: []string{"ord-1"}}, Apply: true})
	if err != nil || res.Done != 1 {
		t.Fatalf("redrive of ord-1 %+v %v", res, err)
	}
	// The redriven message carries its ID and the redrive count, not the
	// dead-letter headers.
	s, err := e.js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if last.Header.Get(jetstream.MsgIDHeader) != "ord-1" || last.Header.Get(idembroker.HeaderRedriven) != "1" || last.Header.Get(idembroker.HeaderReason) != "" ||
		last.Header.Get(idembroker.HeaderOrigin) != "" || last.Header.Get(idemnats.HeaderSubject) != "" || last.Subject != "orders.msgs" {
		t.Fatalf("redriven message %s %v", last.Subject, last.Header)
	}
	o := e.consume(ctx, false, func(o *outcomes) bool { return o.count() >= 2 })
	for _, id := range []string{"ord-1", "ord-2"} {
		if n := e.effects(ctx, id); n != 1 {
			t.Fatalf("%s applied %d times (outcomes %v)", id, n, o.m[id])
		}
	}
	// Inside LONG's hour-long window, a redrive of a letter whose original
	// LONG holds is refused, naming the window; the letter stays.
	if _, err := e.js.Publish(ctx, "long.msgs", []byte(`{}`), jetstream.WithMsgID("dup-1")); err != nil {
		t.Fatal(err)
	}
	dup := &nats.Msg{Subject: "idem.dlq.ORDERS", Data: []byte(`{}`), Header: nats.Header{}}
	dup.Header.Set(jetstream.MsgIDHeader, "dup-1")
	dup.Header.Set(idembroker.HeaderReason, "carrier unknown for order dup-1")
	dup.Header.Set(idembroker.HeaderConsumer, "orders-ship")
	dup.Header.Set(idembroker.HeaderOrigin, "LONG/1")
	dup.Header.Set(idemnats.HeaderSubject, "long.msgs")
	if _, err := e.js.PublishMsg(ctx, dup); err != nil {
		t.Fatal(err)
	}
	_, err = Redrive(ctx, src, in, Selection{Filter: Filter{IDs: []string{"dup-1"}}, Apply: true})
	if err == nil || !strings.Contains(err.Error(), "duplicate window (1h0m0s)") {
		t.Fatalf("redrive inside the duplicate window: %v; want refused naming the window", err)
	}
	if n := peekN(); n != 2 {
		t.Fatalf("%d letters after a refused redrive; want 2", n)
	}
	// Purge: ord-3 and dup-1 leave for good, never applied.
	res, err = Purge(ctx, src, in, Selection{Filter: Filter{IDs: []string{"ord-3", "dup-1"}}, Apply: true})
	if err != nil || res.Done != 2 {
		t.Fatalf("purge %+v %v", res, err)
	}
	if n := peekN(); n != 0 {
		t.Fatalf("%d letters after the purge; want 0", n)
	}
	if n := e.effects(ctx, "ord-3"); n != 0 {
		t.Fatalf("purged ord-3 applied %d times", n)
	}
}
