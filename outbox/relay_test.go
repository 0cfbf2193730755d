package outbox

import (
	"context"
	"slices"
	"testing"

	"github.com/idemkit/idem/sqlinbox"
)

// A committed message is published once, with its ID, event time, key and
// headers; a rolled-back one never is.
func TestCommittedPublishedRolledBackNever(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, enqueue func(rollback bool, msgs ...Message) []string, o *core) {
		log := newLog()
		pub := &testPublisher{name: "a", log: log}
		gone := enqueue(true, Message{Destination: "billing.invoices", Key: "c1", Body: []byte("rolled back")})
		ids := enqueue(false, Message{Destination: "billing.invoices", Key: "c1", Headers: map[string]string{"content-type": "application/json"}, Body: []byte(`{"n":1}`)})
		r, err := newTestRelay(o, pub, nil)
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, r)
		eventually(t, "the committed message marked sent", func() bool {
			st, err := o.stats(context.Background())
			return err == nil && st.Unsent == 0 && st.Sent == 1 && st.Parked == 0
		})
		if got := log.ids(); !slices.Equal(got, ids) {
			t.Fatalf("published %v, want %v (never the rolled-back %v)", got, ids, gone)
		}
		rec := log.got[0]
		if rec.Destination != "billing.invoices" || rec.Key != "c1" || string(rec.Body) != `{"n":1}` || rec.Headers["content-type"] != "application/json" {
			t.Fatalf("record %+v", rec)
		}
		if rec.EventTime.IsZero() || rec.EventTime.UnixMilli() != mustUUIDTime(t, rec.ID).UnixMilli() {
			t.Fatalf("event time %v is not the time inside ID %s", rec.EventTime, rec.ID)
		}
	}
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		o, pool := pgxOutbox(t, nil)
		check(t, func(rb bool, m ...Message) []string { return enqueuePgx(t, o, pool, rb, m...) }, o.core)
	})
	for _, d := range []sqlinbox.Dialect{sqlinbox.Postgres, sqlinbox.SQLite} {
		t.Run("sql-"+d.Name(), func(t *testing.T) {
			t.Parallel()
			o, db := sqlOutbox(t, d, nil)
			check(t, func(rb bool, m ...Message) []string { return enqueueSQL(t, o, db, rb, m...) }, o.core)
		})
	}
}
