package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/bench/peers/report"
)

// Accounts is how many ledger accounts the workload credits: enough that
// two concurrent batches seldom wait for each other's account rows.
const Accounts = 10000

// Credit is a message's body: credit Amount to Account.
type Credit struct {
	Account int32 `json:"account"`
	Amount  int64 `json:"amount"`
}

// Effect is one message's effect: its ID and its credit.
type Effect struct {
	ID string
	Credit
}

// Decode parses a message body the way every consumer here does.
func Decode(id string, body []byte) (Effect, error) {
	e := Effect{ID: id}
	if err := json.Unmarshal(body, &e.Credit); err != nil {
		return e, fmt.Errorf("message %s: %w", id, err)
	}
	return e, nil
}

// schema is the business tables every consumer writes and the inbox the
// hand-rolled consumers claim in. peer_effects has no unique index on
// purpose: a double effect must be visible, not absorbed.
var schema = `
DROP TABLE IF EXISTS peer_accounts, peer_effects, processed_events, processed_events_prunable;
CREATE TABLE peer_accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
INSERT INTO peer_accounts (id) SELECT generate_series(1, ` + fmt.Sprint(Accounts) + `);
CREATE TABLE peer_effects (consumer text NOT NULL, message_id text NOT NULL, account int NOT NULL, amount bigint NOT NULL);
-- The hand-rolled inbox: what a team writes in an afternoon.
CREATE TABLE processed_events (
    consumer     text NOT NULL,
    message_id   text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
-- The same with the index a prune by age needs, as idem's keep_until
-- index serves its prune: without it, each prune reads the whole table.
CREATE TABLE processed_events_prunable (LIKE processed_events INCLUDING ALL);
CREATE INDEX ON processed_events_prunable (processed_at);
`

// Reset recreates the business tables and empties the idem inbox, so each
// run starts from the same state.
func Reset(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("creating the business tables: %w", err)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE idem_inbox`); err != nil {
		return fmt.Errorf("emptying the inbox: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE peer_accounts`); err != nil {
		return err
	}
	return nil
}

// lockAccounts locks the accounts a set of effects credits in id order, so
// that two concurrent transactions wait for each other instead of
// deadlocking.
const lockAccounts = `SELECT 1 FROM peer_accounts WHERE id = ANY($1::int[]) ORDER BY id FOR UPDATE`

// ApplyOne applies one message's effect: the ledger credit and the effect
// row, in one statement.
func ApplyOne(ctx context.Context, tx pgx.Tx, consumer string, e Effect) error {
	_, err := tx.Exec(ctx, `WITH u AS (UPDATE peer_accounts SET balance = balance + $4 WHERE id = $3)
INSERT INTO peer_effects (consumer, message_id, account, amount) VALUES ($1, $2, $3, $4)`,
		consumer, e.ID, e.Account, e.Amount)
	return err
}

// ApplyBatch applies the effects of a batch with set-based statements in
// one round trip: the accounts locked in order, credited by their sums,
// and one effect row per message.
func ApplyBatch(ctx context.Context, tx pgx.Tx, consumer string, es []Effect) error {
	if len(es) == 0 {
		return nil
	}
	ids := make([]string, len(es))
	accts := make([]int32, len(es))
	amounts := make([]int64, len(es))
	for i, e := range es {
		ids[i], accts[i], amounts[i] = e.ID, e.Account, e.Amount
	}
	b := &pgx.Batch{}
	b.Queue(lockAccounts, accts)
	b.Queue(`WITH e AS (SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[]) AS e(message_id, account, amount)),
u AS (UPDATE peer_accounts a SET balance = a.balance + s.total
      FROM (SELECT account, sum(amount) AS total FROM e GROUP BY account) s WHERE a.id = s.account)
INSERT INTO peer_effects (consumer, message_id, account, amount) SELECT $1, message_id, account, amount FROM e`,
		consumer, ids, accts, amounts)
	return tx.SendBatch(ctx, b).Close()
}

// Check is what a run left in the database, against its workload.
type Check = report.Check

// Verify counts the effects consumer left against w.
func Verify(ctx context.Context, pool *pgxpool.Pool, consumer string, w *Workload) (Check, error) {
	var c Check
	var total int64
	err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE n > 1) FROM (
    SELECT message_id, count(*) AS n FROM peer_effects WHERE consumer = $1 GROUP BY message_id) t`, consumer).Scan(&c.Applied, &c.Doubled)
	if err != nil {
		return c, fmt.Errorf("counting effects: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM peer_accounts`).Scan(&total); err != nil {
		return c, fmt.Errorf("summing the ledger: %w", err)
	}
	c.Missing = int64(w.Unique) - c.Applied
	c.Balance = total == w.Total
	return c, nil
}
