package billing

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/idem/sqlinbox"
)

// ChargeRelay sends the charges queued in charge_outbox to the gateway after
// their transaction committed, with their idempotency key, and marks them
// sent. It is at least once: a relay that dies between the gateway's answer
// and the mark sends the charge again, and the key makes the gateway answer
// with the first charge instead of charging twice.
type ChargeRelay struct {
	// DB is the database holding charge_outbox. Required.
	DB *sql.DB
	// Gateway receives the charges. Required.
	Gateway *Gateway
	// Dialect is DB's (for its SQL: MySQL's differs). nil means
	// PostgreSQL or SQLite.
	Dialect sqlinbox.Dialect
	// Batch is the most charges sent per pass. Defaults to 200.
	Batch int
	// BeforeMark, when set, is called after a pass charged and before it
	// marks the charges sent; an error abandons the pass there, as a relay
	// crash would. For drills.
	BeforeMark func(charged int) error
}

// SendPending sends one batch of unsent charges and returns how many it
// sent.
func (r *ChargeRelay) SendPending(ctx context.Context) (int, error) {
	batch := r.Batch
	if batch <= 0 {
		batch = 200
	}
	f := flavorOf(r.Dialect)
	rows, err := r.DB.QueryContext(ctx, f.q(`SELECT id, idempotency_key, customer_id, amount
		FROM charge_outbox WHERE charge_id IS NULL ORDER BY id LIMIT $1`), batch)
	if err != nil {
		return 0, fmt.Errorf("reading charge outbox: %w", err)
	}
	type pending struct {
		id       int64
		key, cus string
		amount   int64
	}
	var todo []pending
	for rows.Next() {
		var p pending
		if err := rows.Scan(&p.id, &p.key, &p.cus, &p.amount); err != nil {
			rows.Close()
			return 0, fmt.Errorf("reading charge outbox: %w", err)
		}
		todo = append(todo, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("reading charge outbox: %w", err)
	}
	if len(todo) == 0 {
		return 0, nil
	}
	chargeIDs := make([]string, len(todo))
	for i, p := range todo {
		c, err := r.Gateway.Charge(ctx, p.key, p.cus, p.amount)
		if err != nil {
			return 0, fmt.Errorf("sending charge %s: %w", p.key, err)
		}
		chargeIDs[i] = c.ID
	}
	if r.BeforeMark != nil {
		if err := r.BeforeMark(len(todo)); err != nil {
			return 0, fmt.Errorf("relay stopped before marking %d charges sent: %w", len(todo), err)
		}
	}
	tx, err := r.DB.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("marking charges sent: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for i, p := range todo {
		if _, err := tx.ExecContext(ctx, f.q(`UPDATE charge_outbox SET charge_id = $1 WHERE id = $2`), chargeIDs[i], p.id); err != nil {
			return 0, fmt.Errorf("marking charge %s sent: %w", p.key, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("marking charges sent: %w", err)
	}
	return len(todo), nil
}

// Run sends pending charges every interval until ctx ends, then returns
// nil. A failed pass is reported to onErr (when set) and tried again at the
// next tick.
func (r *ChargeRelay) Run(ctx context.Context, interval time.Duration, onErr func(error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := r.SendPending(ctx)
			if err != nil && onErr != nil && ctx.Err() == nil {
				onErr(err)
			}
			if err != nil || n == 0 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
