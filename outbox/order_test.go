package outbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Two relays at once on 2,000 rows over 50 keys, written by concurrent
// transactions while they run: each key's messages are published in commit
// order, every row is sent, and no row is published by both relays (no
// lease expired).
//
// Commit order is observed independently of the outbox: each transaction
// enqueues first, then bumps its key's counter (a row lock, so the
// counter's order is commit order) and records which ID got which count.
// Without Enqueue's key lock, two transactions of one key could take seqs
// in one order and commit in the other.
func TestTwoRelaysKeepOrderPerKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o, pool := pgxOutbox(t, nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE counters (key text PRIMARY KEY, n int NOT NULL DEFAULT 0);
CREATE TABLE commits (id text PRIMARY KEY, key text NOT NULL, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const keys, rows, writers = 50, 2000, 6
	for k := range keys {
		if _, err := pool.Exec(ctx, `INSERT INTO counters (key) VALUES ($1)`, fmt.Sprintf("k%02d", k)); err != nil {
			t.Fatal(err)
		}
	}
	log := newLog()
	cfg := &RelayConfig{LeaseTerm: 6 * time.Second, PollInterval: 50 * time.Millisecond, BatchSize: 50}
	var relays []*Relay
	for _, name := range []string{"a", "b"} {
		c := *cfg
		c.Name = name
		r, err := NewRelay(o, &testPublisher{name: name, log: log}, &c)
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
		runRelay(t, r)
	}
	// Both relays hold their fair share before the writers start, so both
	// publish.
	eventually(t, "the shards shared by both relays", func() bool {
		var owners, held int
		err := pool.QueryRow(ctx, `SELECT count(DISTINCT owner), count(*) FROM idem_outbox_leases WHERE owner <> '' AND expires_at > now()`).Scan(&owners, &held)
		return err == nil && owners == 2 && held == DefaultShards
	})

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < rows/writers+1; {
				n := 1 + rng.IntN(3)
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					msgs := make([]Message, n)
					for j := range msgs {
						msgs[j] = Message{Destination: "events", Key: fmt.Sprintf("k%02d", rng.IntN(keys)), Body: []byte("x")}
					}
					ids, err := o.Enqueue(ctx, tx, msgs...)
					if err != nil {
						return err
					}
					for j, m := range msgs {
						if _, err := tx.Exec(ctx, `WITH c AS (UPDATE counters SET n = n + 1 WHERE key = $1 RETURNING n)
INSERT INTO commits (id, key, n) SELECT $2, $1, n FROM c`, m.Key, ids[j]); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				i += n
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM commits`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every row marked sent", func() bool {
		st, err := o.Stats(ctx)
		return err == nil && st.Sent == int64(total)
	})
	for _, r := range relays {
		if r.Published() == 0 {
			t.Errorf("relay published nothing: the work was not shared")
		}
	}
	countOf := map[string]int{}
	crs, err := pool.Query(ctx, `SELECT id, n FROM commits`)
	if err != nil {
		t.Fatal(err)
	}
	for crs.Next() {
		var id string
		var n int
		if err := crs.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		countOf[id] = n
	}
	if crs.Err() != nil {
		t.Fatal(crs.Err())
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.dups) > 0 {
		t.Fatalf("%d rows published twice, e.g. %s", len(log.dups), log.dups[0])
	}
	if len(log.got) != total {
		t.Fatalf("published %d, want %d", len(log.got), total)
	}
	last := map[string]int{}
	for _, r := range log.got {
		n, ok := countOf[r.ID]
		if !ok {
			t.Fatalf("published %s, which no transaction committed", r.ID)
		}
		if n != last[r.Key]+1 {
			t.Fatalf("key %s: published its commit #%d after #%d", r.Key, n, last[r.Key])
		}
		last[r.Key] = n
	}
	st, err := o.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unsent != 0 || st.Sent != int64(total) {
		t.Fatalf("stats %+v, want %d sent", st, total)
	}
}
