package idemnats_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/natstest"
	"github.com/idemkit/idem/internal/netfault"
)

// While the inbox database does not answer (a proxy that stops
// answering), the consumer holds its messages past AckWait without the
// server redelivering them: InProgress heartbeats keep them, Health
// shows the hold and its reason with the connection up, and nothing is
// dead-lettered. When the database is back, every message is applied
// once and the hold ends.
func TestOutageHeldPastAckWait(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	stream := uniqueName(t)
	createStreams(t, js, stream)
	d := newDB(t)
	u, err := url.Parse(d.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := netfault.New(t, u.Host)
	pu, err := url.Parse(proxy.URL(t, d.url))
	if err != nil {
		t.Fatal(err)
	}
	q := pu.Query()
	q.Set("connect_timeout", "1")
	pu.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), pu.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	const held = 5
	c, err := idemnats.NewConsumer(d.processorOn(t, pool), &idemnats.Config{
		URL: srv.URL(), Stream: stream, BatchSize: held, AckWait: 3 * time.Second, Heartbeat: 500 * time.Millisecond,
		FetchWait: time.Second, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	publish(t, js, stream, "before", 1)
	waitFor(t, 30*time.Second, "the first message applied", func() bool { return c.Stats().Applied == 1 })
	proxy.Stop()
	publish(t, js, stream, "during", held)
	waitFor(t, 60*time.Second, "the consumer's health to show the hold", func() bool { return c.Health().Holding })
	// Eight heartbeat rounds of every held message (the batch fetched
	// when the outage began; the rest waits in the stream): held 4s,
	// longer than AckWait.
	inFlight := uint64(c.Health().InFlight)
	hb := c.Stats().Heartbeats
	waitFor(t, 60*time.Second, "eight heartbeat rounds", func() bool { return c.Stats().Heartbeats >= hb+8*inFlight })
	h := c.Health()
	if !h.Holding || h.HoldReason == "" || !h.Connected || h.InFlight < 1 {
		t.Errorf("health during the outage %+v; want holding with a reason, connected, messages in flight", h)
	}
	proxy.Restore()
	waitFor(t, 60*time.Second, "every message applied after the outage", func() bool { _, k := d.effects(t); return k == held+1 })
	waitFor(t, 30*time.Second, "the hold to end", func() bool { return !c.Health().Holding })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("stats %+v", st)
	if st.Redelivered != 0 || st.DeadLettered != 0 || st.Naked != 0 {
		t.Errorf("stats %+v; want nothing redelivered by the server (the heartbeats kept every held message), dead-lettered or Nak'd", st)
	}
	if rows, distinct := d.effects(t); rows != held+1 || distinct != held+1 {
		t.Errorf("%d effects of %d messages; want %d, one each", rows, distinct, held+1)
	}
}
