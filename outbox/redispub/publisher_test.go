package redispub_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/idembroker"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/redispub"
)

// A server that may forget what it answered is refused, naming the
// setting; accepting it is a choice made in the open.
func TestRefusesUnsyncedServer(t *testing.T) {
	srv := redistest.Start(t, "--appendfsync", "everysec")
	rdb := srv.Client(nil)
	ctx := context.Background()
	_, err := redispub.New(ctx, rdb, nil)
	if !errors.Is(err, redispub.ErrUnsafe) {
		t.Fatalf("New = %v; want an error wrapping ErrUnsafe", err)
	}
	t.Logf("refused: %v", err)
	if _, err := redispub.New(ctx, rdb, &redispub.Config{AcceptUnsyncedWrites: true}); err != nil {
		t.Fatalf("New with AcceptUnsyncedWrites = %v", err)
	}
}

// Records land as entries an idemredis consumer reads (ID, event time,
// key, body, headers), in commit order; a record to a missing stream is
// refused and the later records of its key are not attempted, while the
// other keys go on.
func TestPublish(t *testing.T) {
	srv := redistest.Start(t) // appendfsync always
	rdb := srv.Client(nil)
	ctx := context.Background()
	p, err := redispub.New(ctx, rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, rdb, "orders"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rec := func(id, dest, key string) outbox.Record {
		return outbox.Record{ID: id, Destination: dest, Key: key, Body: []byte("body of " + id), EventTime: at,
			Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	}
	recs := []outbox.Record{
		rec(idem.NewUUIDv7(at), "orders", "a"),
		rec("lost-1", "no-such-stream", "b"),
		rec("b-2", "orders", "b"),
		rec(idem.NewUUIDv7(at), "orders", "a"),
	}
	errs := p.Publish(ctx, recs)
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("errors of key a: %v, %v; want nil", errs[0], errs[3])
	}
	if !outbox.IsRefused(errs[1]) {
		t.Errorf("record to a missing stream: %v; want refused", errs[1])
	}
	if !errors.Is(errs[2], outbox.ErrNotAttempted) {
		t.Errorf("record after a refused one of its key: %v; want ErrNotAttempted", errs[2])
	}
	if n, _ := rdb.Exists(ctx, "no-such-stream").Result(); n != 0 {
		t.Error("the publisher created a stream no group reads")
	}
	got, err := rdb.XRange(ctx, "orders", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d entries; want 2", len(got))
	}
	for i, want := range []outbox.Record{recs[0], recs[3]} {
		v := got[i].Values
		if v[idemredis.DefaultIDField] != want.ID || v[idemredis.DefaultBodyField] != string(want.Body) ||
			v[idemredis.DefaultKeyField] != "a" || v[idembroker.HeaderEventTime] != at.Format(time.RFC3339Nano) ||
			v["traceparent"] != want.Headers["traceparent"] {
			t.Errorf("entry %d: %v; want the fields of %+v", i, v, want)
		}
	}
	// A header on a field the publisher sets is the record's fault.
	bad := rec("c-1", "orders", "c")
	bad.Headers[idemredis.DefaultIDField] = "forged"
	if errs := p.Publish(ctx, []outbox.Record{bad}); !outbox.IsRefused(errs[0]) {
		t.Errorf("record with a header on the ID field: %v; want refused", errs[0])
	}
	// Redis away: an outage, not the record's fault.
	srv.Kill()
	errs = p.Publish(ctx, []outbox.Record{rec("d-1", "orders", "d")})
	if errs[0] == nil || outbox.IsRefused(errs[0]) {
		t.Errorf("publish with Redis down: %v; want an outage error, not refused", errs[0])
	}
}
