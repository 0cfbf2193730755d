package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlinbox"
)

// Prune deletes the rows sent longer ago than the retention, in batches;
// unsent, parked and recently sent rows stay.
func TestPruneDeletesOnlyOldSentRows(t *testing.T) {
	t.Parallel()
	for _, d := range []sqlinbox.Dialect{sqlinbox.Postgres, sqlinbox.SQLite} {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o, db := sqlOutbox(t, d, nil)
			var msgs []Message
			for range 7 {
				msgs = append(msgs, Message{Destination: "events", Body: []byte("x")})
			}
			ids := enqueueSQL(t, o, db, false, msgs...)
			old := "now() - interval '8 days'"
			if d == sqlinbox.SQLite {
				old = "strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '-8 days')"
			}
			arg := "$1"
			if d == sqlinbox.SQLite {
				arg = "?1"
			}
			// Five sent 8 days ago, one sent now, one parked 8 days ago.
			for _, id := range ids[:5] {
				if _, err := db.ExecContext(ctx, `UPDATE idem_outbox SET sent_at = `+old+` WHERE id = `+arg, id); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.ExecContext(ctx, `UPDATE idem_outbox SET sent_at = enqueued_at WHERE id = `+arg, ids[5]); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `UPDATE idem_outbox SET parked_at = `+old+`, parked_reason = 'refused' WHERE id = `+arg, ids[6]); err != nil {
				t.Fatal(err)
			}
			n, err := o.Prune(ctx, PruneOptions{DryRun: true})
			if err != nil || n != 5 {
				t.Fatalf("dry run: %d, %v; want 5", n, err)
			}
			n, err = o.Prune(ctx, PruneOptions{BatchSize: 2})
			if err != nil || n != 5 {
				t.Fatalf("prune: %d, %v; want 5", n, err)
			}
			st, err := o.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Sent != 1 || st.Parked != 1 || st.Unsent != 0 {
				t.Fatalf("after prune %+v: want the recent sent row and the parked one", st)
			}
		})
	}
}

// Migrate is idempotent, stores the shard count, and refuses another one.
func TestMigrateStoresShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o, pool := pgxOutbox(t, &Config{Shards: 8})
	r, err := o.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Created || r.From != r.To || r.Shards != 8 {
		t.Fatalf("second migrate %+v: want a no-op keeping 8 shards", r)
	}
	var leases int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox_leases`).Scan(&leases); err != nil || leases != 8 {
		t.Fatalf("%d leases, %v; want 8", leases, err)
	}
	other, err := NewPgx(pool, &Config{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Migrate(ctx); !errors.Is(err, idem.ErrConfig) || !strings.Contains(err.Error(), "8 stored") {
		t.Fatalf("migrate with another shard count: %v", err)
	}
	same, err := NewPgx(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := same.Migrate(ctx); err != nil || r.Shards != 8 {
		t.Fatalf("migrate with the stored count: %+v, %v", r, err)
	}
}

// Enqueue refuses bad messages with a reason and writes none of the call's
// messages.
func TestEnqueueValidates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o, db := sqlOutbox(t, sqlinbox.SQLite, &Config{MaxBody: 8})
	cases := map[string]Message{
		"destination is empty":          {Body: []byte("x")},
		"exceeds the limit of 8":        {Destination: "t", Body: []byte("123456789")},
		"needs a routing key":           {DefaultExchange: true},
		"together with DefaultExchange": {Destination: "x", DefaultExchange: true, RoutingKey: "q"},
		"printable ASCII":               {Destination: "t", Headers: map[string]string{"bad name": "v"}},
		"valid UTF-8":                   {Destination: "t", Key: "\xff"},
	}
	for want, m := range cases {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = o.Enqueue(ctx, tx, Message{Destination: "fine", Body: []byte("ok")}, m)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "message 1") {
			t.Errorf("%+v: %v, want ErrInvalid saying %q", m, err, want)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := o.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unsent != 0 {
		t.Fatalf("%d rows written by refused calls", st.Unsent)
	}
	ids := enqueueSQL(t, o, db, false, Message{DefaultExchange: true, RoutingKey: "invoices", Body: []byte("ok")})
	if len(ids) != 1 {
		t.Fatal(ids)
	}
	if st, err := o.Stats(ctx); err != nil || st.Unsent != 1 || st.Destinations[0].Destination != "" {
		t.Fatalf("default exchange row: %+v, %v", st, err)
	}
}
