package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/amqppub"
	"github.com/idemkit/idem/reconcile"
)

type reconcileReport = reconcile.Report

// enqueue writes n messages to the consumer's queue through the outbox, in
// transactions of 100, and returns their IDs.
func (d *db) enqueue(t testing.TB, n int, msg func(i int) outbox.Message) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for from := 0; from < n; from += 100 {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []outbox.Message
		for i := from; i < min(n, from+100); i++ {
			msgs = append(msgs, msg(i))
		}
		got, err := d.ob.Enqueue(ctx, tx, msgs...)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	return ids
}

func (d *db) unsent(t testing.TB) int {
	t.Helper()
	var n int
	if err := d.pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReconcileRabbitMQOutbox: a live pipeline — outbox, relay, RabbitMQ,
// an idemrabbitmq consumer — applies N messages; the markers and effects
// of 100 random ones are deleted behind the consumer's back. Reconciling
// against the outbox reports exactly those 100; a repair redelivers them to
// the consumer's queue and the consumer applies each once; a second
// reconciliation reports nothing missing.
func TestReconcileRabbitMQOutbox(t *testing.T) {
	t.Parallel()
	const n = 500
	ctx := context.Background()
	d := newDB(t)
	conn := dial(t)
	q := queue(t, conn)

	dups := new(duplicates)
	proc := d.processor(t, idem.ByMessageID, dups)
	cons, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{URL: amqpURL(), Queue: q, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "consumer", cons.Run)
	relayPub, err := amqppub.New(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(d.ob, relayPub, &outbox.RelayConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "relay", relay.Run)

	ids := d.enqueue(t, n, func(i int) outbox.Message {
		return outbox.Message{DefaultExchange: true, RoutingKey: q, Body: fmt.Appendf(nil, `{"n":%d}`, i)}
	})
	waitFor(t, 3*time.Minute, "the pipeline to apply every message", func() bool {
		_, distinct := d.effects(t)
		return distinct == n && d.unsent(t) == 0
	})
	lost := d.lose(t, ids, 100)

	src := &reconcile.Outbox{Rows: d.ob, RoutingKey: q}
	rep, err := reconcile.Check(ctx, src, proc, reconcile.Range{From: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got := missingIDs(&rep); !slices.Equal(got, lost) {
		t.Fatalf("reported %d missing, want exactly the %d lost:\ngot  %v\nwant %v", len(got), len(lost), got, lost)
	}
	if rep.Checked != n || rep.Counts[reconcile.Applied] != n-100 || len(rep.Other) != 0 {
		t.Fatalf("checked %d, counts %v, other %v: want %d checked, %d applied", rep.Checked, rep.Counts, rep.Other, n, n-100)
	}
	for _, f := range rep.Missing {
		if f.Time.IsZero() || !strings.HasPrefix(f.Position, "seq ") || f.Record == nil {
			t.Fatalf("finding %+v: want its time, position and payload", f)
		}
	}

	pub, err := amqppub.New(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	repaired, err := reconcile.Repair(ctx, &rep, reconcile.RepairConfig{Publisher: pub, RoutingKey: q, Rate: 1000, Logger: quiet})
	if err != nil || !slices.Equal(slices.Sorted(slices.Values(repaired.Sent)), lost) {
		t.Fatalf("repair: %v, sent %d, want the %d lost", err, len(repaired.Sent), len(lost))
	}
	waitFor(t, 3*time.Minute, "the consumer to apply the redelivered messages", func() bool {
		_, distinct := d.effects(t)
		return distinct == n
	})
	again, err := reconcile.Check(ctx, src, proc, reconcile.Range{})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Missing) != 0 || again.Counts[reconcile.Applied] != n {
		t.Fatalf("after the repair: %d missing, counts %v", len(again.Missing), again.Counts)
	}
	// A repair run again on the old report doubles nothing: the inbox
	// absorbs every copy.
	if _, err := reconcile.Repair(ctx, &rep, reconcile.RepairConfig{Publisher: pub, RoutingKey: q, Rate: 1000, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "the consumer to meet the second copies", func() bool { return dups.all(lost) })
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects: %d rows for %d messages, want %d once each", rows, distinct, n)
	}
}

// TestReconcileBusinessKeyAndWindow: with a business key, a message whose
// key's marker was written by another message ID is applied, not missing;
// a message older than the window is beyond the window, never missing; an
// ID file is judged like any source, and a repair from it is refused.
func TestReconcileBusinessKeyAndWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDB(t)
	byOrder := func(m idem.Message) (string, error) {
		if k := m.Headers["order"]; k != "" {
			return "order:" + k, nil
		}
		return m.ID, nil
	}
	proc := d.processor(t, byOrder)
	ids := d.enqueue(t, 3, func(i int) outbox.Message {
		order := []string{"o-1", "o-1", "o-2"}[i]
		return outbox.Message{Destination: "orders", Headers: map[string]string{"order": order}, Body: []byte(order)}
	})
	if _, err := d.pool.Exec(ctx, `UPDATE idem_outbox SET sent_at = now()`); err != nil {
		t.Fatal(err)
	}
	// The first message of order o-1 is applied; the second (a republish
	// under a new ID) never reached the consumer, nor did o-2's.
	rows, err := d.ob.SentRows(ctx, outbox.SentFilter{})
	if err != nil || len(rows) != 3 {
		t.Fatalf("sent rows: %v %v", rows, err)
	}
	if r := proc.Process(ctx, idem.Message{ID: ids[0], Headers: rows[0].Headers, Body: rows[0].Body, Time: rows[0].EventTime, TimeSource: idem.TimeFromID}); r.Outcome != idem.Applied {
		t.Fatalf("applying %s: %s %v", ids[0], r.Outcome, r.Err)
	}
	rep, err := reconcile.Check(ctx, &reconcile.Outbox{Rows: d.ob, Destination: "orders"}, proc, reconcile.Range{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Missing) != 1 || rep.Missing[0].ID != ids[2] || rep.Missing[0].Key != "order:o-2" {
		t.Fatalf("missing %+v: want only %s (order o-2)", rep.Missing, ids[2])
	}
	if len(rep.Other) != 1 || rep.Other[0].ID != ids[1] || rep.Other[0].Status != reconcile.AppliedAs || rep.Other[0].By != ids[0] {
		t.Fatalf("other %+v: want %s applied as %s", rep.Other, ids[1], ids[0])
	}
	if rep.Counts[reconcile.Applied] != 1 {
		t.Fatalf("counts %v", rep.Counts)
	}
	// Another destination's rows are not this consumer's.
	if none, err := reconcile.Check(ctx, &reconcile.Outbox{Rows: d.ob, Destination: "shipping"}, proc, reconcile.Range{}); err != nil || none.Checked != 0 {
		t.Fatalf("another destination: checked %d, %v", none.Checked, err)
	}

	// An ID file: applied, missing, beyond the window, out of range.
	old := time.Now().Add(-400 * 24 * time.Hour).UTC().Format(time.RFC3339)
	recent := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	file := strings.Join([]string{
		"# exported from the payment provider",
		"pay-6",
		"",
		"pay-7 " + recent,
		"pay-8," + old,
		"pay-9\t" + time.Now().Add(48*time.Hour).UTC().Format(time.RFC3339),
	}, "\n")
	src := &reconcile.IDFile{Path: "ids.txt", R: strings.NewReader(file)}
	plain := d.processor(t, idem.ByMessageID)
	if r := plain.Process(ctx, idem.Message{ID: "pay-6", Time: time.Now(), TimeSource: idem.TimeFromHeader}); r.Outcome != idem.Applied {
		t.Fatalf("applying pay-6: %s %v", r.Outcome, r.Err)
	}
	rep, err = reconcile.Check(ctx, src, plain, reconcile.Range{To: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Missing) != 1 || rep.Missing[0].ID != "pay-7" || rep.Missing[0].Position != "line 4" {
		t.Fatalf("missing %+v: want pay-7 at line 4", rep.Missing)
	}
	if len(rep.Other) != 1 || rep.Other[0].ID != "pay-8" || rep.Other[0].Status != reconcile.BeyondWindow {
		t.Fatalf("other %+v: want pay-8 beyond the window", rep.Other)
	}
	if rep.Checked != 3 || rep.Counts[reconcile.Applied] != 1 {
		t.Fatalf("checked %d, counts %v: want 3 (pay-9 is after the range)", rep.Checked, rep.Counts)
	}
	if _, err := reconcile.Repair(ctx, &rep, reconcile.RepairConfig{RoutingKey: "q"}); !errors.Is(err, reconcile.ErrNoPayload) {
		t.Fatalf("repair from an ID file: %v, want ErrNoPayload", err)
	}
	bad := &reconcile.IDFile{Path: "bad.txt", R: strings.NewReader("a b c\n")}
	if _, err := reconcile.Check(ctx, bad, plain, reconcile.Range{}); err == nil || !strings.Contains(err.Error(), "bad.txt line 1") {
		t.Fatalf("a bad line: %v", err)
	}
}
