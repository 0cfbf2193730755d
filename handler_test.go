package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// TestJSONBatchBadBody runs a batch of ten on PostgreSQL in which one body
// is not JSON: the nine others are applied with their decoded values, and
// the bad one alone is dead-lettered with an error naming it and the
// decoding failure.
func TestJSONBatchBadBody(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE credits (event_id text PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	type credit struct {
		Account string `json:"account"`
		Amount  int64  `json:"amount"`
	}
	var (
		mu   sync.Mutex
		seen []string // message IDs the handler was given
	)
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "credits",
		Key:      idem.ByMessageID,
		HandleBatch: idem.JSONBatch(func(ctx context.Context, tx pgx.Tx, msgs []idem.Message, vs []credit) error {
			mu.Lock()
			for _, m := range msgs {
				seen = append(seen, m.ID)
			}
			mu.Unlock()
			b := &pgx.Batch{}
			for i, v := range vs {
				b.Queue(`INSERT INTO credits (event_id, account, amount) VALUES ($1, $2, $3)`, msgs[i].ID, v.Account, v.Amount)
			}
			return tx.SendBatch(ctx, b).Close()
		}),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}

	const bad = 6
	msgs := make([]idem.Message, 10)
	for i := range msgs {
		body := fmt.Sprintf(`{"account":"acct-%d","amount":%d}`, i, 100*(i+1))
		if i == bad {
			body = `{"account":"acct-6","amount":` // cut off mid-body
		}
		msgs[i] = idem.Message{ID: fmt.Sprintf("evt-%d", i), Body: []byte(body)}
	}
	rs := proc.ProcessBatch(ctx, msgs)

	for i, r := range rs {
		if i == bad {
			continue
		}
		if r.Outcome != idem.Applied {
			t.Errorf("%s: %v (%v), want applied", msgs[i].ID, r.Outcome, r.Err)
		}
	}
	r := rs[bad]
	var syntax *json.SyntaxError
	if r.Outcome != idem.DeadLettered || !idem.IsPermanent(r.Err) {
		t.Fatalf("bad body: %v (%v), want dead-lettered with a permanent error", r.Outcome, r.Err)
	}
	if !strings.Contains(r.Err.Error(), msgs[bad].ID) || !strings.Contains(r.Err.Error(), "decoding") ||
		!errors.As(r.Err, &syntax) {
		t.Errorf("bad body's error %q names neither the message nor the decoding failure", r.Err)
	}

	rows, err := pool.Query(ctx, `SELECT event_id, account, amount FROM credits ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]credit{}
	for rows.Next() {
		var id string
		var c credit
		if err := rows.Scan(&id, &c.Account, &c.Amount); err != nil {
			t.Fatal(err)
		}
		got[id] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 9 {
		t.Errorf("%d credits written, want 9: %v", len(got), got)
	}
	for i, m := range msgs {
		c, ok := got[m.ID]
		switch {
		case i == bad && ok:
			t.Errorf("the bad message was written: %+v", c)
		case i != bad && (c.Account != fmt.Sprintf("acct-%d", i) || c.Amount != int64(100*(i+1))):
			t.Errorf("%s written as %+v", m.ID, c)
		}
	}
	// The handler never received the bad message: decoding failed first.
	if slices.Contains(seen, msgs[bad].ID) {
		t.Errorf("the handler was given the message whose body does not decode: %v", seen)
	}
}
