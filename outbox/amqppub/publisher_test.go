package amqppub_test

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"
)

// What the publisher publishes is what an idemrabbitmq consumer reads: the
// record's ID as the message ID, the time inside it as the event time
// (from the ID), the caller's headers and the event-time header; the AMQP
// timestamp is the event time and the message is persistent.
func TestDeliveredAsIdemReadsIt(t *testing.T) {
	t.Parallel()
	conn := dial(t, amqpURL())
	q := queue(t, conn, nil)
	pub := publisher(t, conn, nil)
	var recs []outbox.Record
	for i := range 12 {
		r := rec(q, fmt.Sprintf("customer-%d", i%3), i, fmt.Sprintf(`{"n":%d}`, i))
		r.Headers["content-kind"] = "invoice"
		recs = append(recs, r)
	}
	for i, err := range pub.Publish(context.Background(), recs) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	got := drain(t, conn, q, len(recs))
	if len(got) != len(recs) {
		t.Fatalf("the queue had %d messages, want %d", len(got), len(recs))
	}
	byID := map[string]outbox.Record{}
	for _, r := range recs {
		byID[r.ID] = r
	}
	for _, d := range got {
		m := idemrabbitmq.Message(&d, q, "")
		r, ok := byID[m.ID]
		switch {
		case !ok:
			t.Errorf("message %q was never published", m.ID)
		case m.TimeSource != idem.TimeFromID || !m.Time.Equal(r.EventTime):
			t.Errorf("message %s: event time %v from %v, want %v from the ID", m.ID, m.Time, m.TimeSource, r.EventTime)
		case string(m.Body) != string(r.Body):
			t.Errorf("message %s: body %q, want %q", m.ID, m.Body, r.Body)
		case m.Headers["content-kind"] != "invoice" || m.Headers["x-seq"] != r.Headers["x-seq"]:
			t.Errorf("message %s: headers %v lack the caller's", m.ID, m.Headers)
		case m.Headers[idembroker.HeaderEventTime] != r.EventTime.Format(time.RFC3339Nano):
			t.Errorf("message %s: event-time header %q, want %q", m.ID, m.Headers[idembroker.HeaderEventTime], r.EventTime.Format(time.RFC3339Nano))
		case !d.Timestamp.Equal(r.EventTime.Truncate(time.Second)):
			t.Errorf("message %s: timestamp %v, want the event time %v", m.ID, d.Timestamp, r.EventTime)
		case d.DeliveryMode != amqp.Persistent:
			t.Errorf("message %s: delivery mode %d, want persistent", m.ID, d.DeliveryMode)
		}
	}
}

// A message routed to no queue is returned (mandatory) and refused; its
// key's later records are not published, and the other keys' are.
func TestUnroutableRefused(t *testing.T) {
	t.Parallel()
	conn := dial(t, amqpURL())
	q := queue(t, conn, nil)
	pub := publisher(t, conn, nil)
	recs := []outbox.Record{
		rec(q, "a", 0, "a0"),
		rec(name(t), "b", 1, "b1"), // no such queue
		rec(q, "a", 2, "a2"),
		rec(q, "b", 3, "b3"),
		rec(q, "c", 4, "c4"),
	}
	errs := pub.Publish(context.Background(), recs)
	if errs[0] != nil || errs[2] != nil || errs[4] != nil {
		t.Fatalf("routable records failed:%s", describe(errs))
	}
	if !outbox.IsRefused(errs[1]) || !errors.Is(errs[1], idemrabbitmq.ErrUnroutable) {
		t.Errorf("unroutable record: %v, want refused, wrapping ErrUnroutable", errs[1])
	}
	if !errors.Is(errs[3], outbox.ErrNotAttempted) {
		t.Errorf("later record of the refused key: %v, want ErrNotAttempted", errs[3])
	}
	var bodies []string
	for _, d := range drain(t, conn, q, 3) {
		bodies = append(bodies, string(d.Body))
	}
	// Keys go out side by side; a key's records in order.
	if got := strings.Join(bodies, ","); got != "a0,a2,c4" && got != "a0,c4,a2" {
		t.Errorf("the queue holds %s, want a0, a2 and c4, a0 before a2", got)
	}
	// The channel is still good for the next call.
	if err := pub.Publish(context.Background(), []outbox.Record{rec(q, "b", 5, "b5")})[0]; err != nil {
		t.Errorf("publishing after a return: %v", err)
	}
}

// A record to an exchange that does not exist is refused before it is
// published (publishing it would close the channel); its neighbours go
// through. A body over the limit is refused the same way.
func TestMissingExchangeAndTooLargeRefused(t *testing.T) {
	t.Parallel()
	conn := dial(t, amqpURL())
	q := queue(t, conn, nil)
	pub := publisher(t, conn, &amqppub.Config{MaxBodyBytes: 1024})
	missing := rec(q, "b", 1, "b1")
	missing.Destination = name(t)
	recs := []outbox.Record{
		rec(q, "a", 0, "a0"),
		missing,
		rec(q, "c", 2, strings.Repeat("x", 2048)),
		rec(q, "a", 3, "a3"),
		rec(q, "c", 4, "c4"),
		rec(q, "d", 5, "d5"),
	}
	errs := pub.Publish(context.Background(), recs)
	if errs[0] != nil || errs[3] != nil || errs[5] != nil {
		t.Fatalf("healthy records failed:%s", describe(errs))
	}
	if !outbox.IsRefused(errs[1]) || !strings.Contains(errs[1].Error(), "does not exist") {
		t.Errorf("record to a missing exchange: %v, want refused", errs[1])
	}
	if !outbox.IsRefused(errs[2]) || !strings.Contains(errs[2].Error(), "MaxBodyBytes") {
		t.Errorf("record over the size limit: %v, want refused", errs[2])
	}
	if !errors.Is(errs[4], outbox.ErrNotAttempted) {
		t.Errorf("later record of the too-large key: %v, want ErrNotAttempted", errs[4])
	}
	if got := len(drain(t, conn, q, 3)); got != 3 {
		t.Errorf("the queue had %d messages, want 3", got)
	}
}

// A nack (here a full queue that rejects publishes) is an outage, not a
// refusal, and the nacked record's key stops there: its later record is
// not published, so it can never arrive ahead of the nacked one's retry.
func TestNackIsOutageAndStopsItsKey(t *testing.T) {
	t.Parallel()
	conn := dial(t, amqpURL())
	q := queue(t, conn, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	pub := publisher(t, conn, nil)
	recs := []outbox.Record{
		rec(q, "a", 0, "a0"),
		rec(q, "b", 1, "b1"),
		rec(q, "a", 2, "a2"), // the queue is full by now
		rec(q, "a", 3, "a3"),
	}
	errs := pub.Publish(context.Background(), recs)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("records that fit failed:%s", describe(errs))
	}
	if errs[2] == nil || outbox.IsRefused(errs[2]) || errors.Is(errs[2], outbox.ErrNotAttempted) {
		t.Errorf("nacked record: %v, want an outage error", errs[2])
	}
	if !errors.Is(errs[3], outbox.ErrNotAttempted) {
		t.Errorf("record after the nacked one: %v, want ErrNotAttempted", errs[3])
	}
}

// A broker that stops answering, then drops the connection, is an outage:
// the call ends with ctx and nothing is refused. Once it is back, the
// publisher dials again (Config.Redial) and publishes.
func TestBrokerDownThenBack(t *testing.T) {
	t.Parallel()
	direct := dial(t, amqpURL())
	q := queue(t, direct, nil)
	u, err := neturl.Parse(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := netfault.New(t, u.Host)
	url := proxy.URL(t, amqpURL())
	redial := func(ctx context.Context) (*amqp.Connection, error) {
		return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second), Heartbeat: time.Second})
	}
	conn, err := redial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	pub := publisher(t, conn, &amqppub.Config{Redial: redial})

	proxy.Freeze()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	errs := pub.Publish(ctx, []outbox.Record{rec(q, "a", 0, "a0"), rec(q, "b", 1, "b1"), rec(q, "a", 2, "a2")})
	cancel()
	for i, err := range errs {
		if err == nil || outbox.IsRefused(err) {
			t.Errorf("record %d with the broker silent: %v, want an outage error", i, err)
		}
	}
	proxy.Stop()
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	errs = pub.Publish(ctx, []outbox.Record{rec(q, "c", 3, "c3")})
	cancel()
	if errs[0] == nil || outbox.IsRefused(errs[0]) {
		t.Errorf("record with the broker gone: %v, want an outage error", errs[0])
	}

	proxy.Restore()
	var last []error
	for range 20 { // the first call may still meet the dead connection
		last = pub.Publish(context.Background(), []outbox.Record{rec(q, "a", 4, "back")})
		if last[0] == nil {
			break
		}
	}
	if last[0] != nil {
		t.Fatalf("publishing once the broker is back: %v", last[0])
	}
	found := false
	for _, d := range drain(t, direct, q, 1) {
		found = found || string(d.Body) == "back"
	}
	if !found {
		t.Error("the record published after the outage is not in the queue")
	}
}

// Records of one key arrive in the order they were handed over: 1,000
// records on 10 keys, 100 a call.
func TestPerKeyOrder(t *testing.T) {
	t.Parallel()
	conn := dial(t, amqpURL())
	q := queue(t, conn, nil)
	pub := publisher(t, conn, nil)
	const n, keys, call = 1000, 10, 100
	for from := 0; from < n; from += call {
		var recs []outbox.Record
		for i := from; i < from+call; i++ {
			recs = append(recs, rec(q, fmt.Sprintf("key-%d", i%keys), i, fmt.Sprint(i)))
		}
		for i, err := range pub.Publish(context.Background(), recs) {
			if err != nil {
				t.Fatalf("record %d: %v", from+i, err)
			}
		}
	}
	got := drain(t, conn, q, n)
	if len(got) != n {
		t.Fatalf("the queue had %d messages, want %d", len(got), n)
	}
	last := map[string]int{}
	for _, d := range got {
		var seq int
		if _, err := fmt.Sscan(string(d.Body), &seq); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("key-%d", seq%keys)
		if prev, ok := last[key]; ok && seq <= prev {
			t.Errorf("key %s: record %d after %d", key, seq, prev)
		}
		last[key] = seq
	}
}
