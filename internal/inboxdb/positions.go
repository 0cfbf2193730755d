package inboxdb

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/idemstore"
)

// RecordPositions upserts, on c (the transaction of the claims they vouch
// for), the position of each source of ps for consumer: one row per
// source (docs/design.md 17).
func (b *Inbox) RecordPositions(ctx context.Context, c Conn, consumer string, ps []idemstore.Position) error {
	for _, p := range ps {
		if _, err := c.Exec(ctx, b.D.RecordPosition, b.D.Table.Quoted(), consumer, p.Source, p.Next); err != nil {
			return fmt.Errorf("recording the position of %s in %s: %w", consumer, p.Source, err)
		}
	}
	return nil
}

// Positions reads the positions recorded for consumer, by source.
func (b *Inbox) Positions(ctx context.Context, consumer string) ([]idemstore.Position, error) {
	var out []idemstore.Position
	err := b.read(ctx, func(c Conn) error {
		out = nil
		return c.Query(ctx, b.D.Positions, func(r Row) error {
			var p idemstore.Position
			var at any
			if err := r.Scan(&p.Source, &p.Next, &at); err != nil {
				return err
			}
			var err error
			p.Updated, err = b.D.ScanTime(at)
			out = append(out, p)
			return err
		}, b.D.Table.Quoted(), consumer)
	})
	if err != nil {
		return nil, fmt.Errorf("reading the positions of %s: %w", consumer, err)
	}
	return out, nil
}

// ForgetPositions deletes the positions recorded for consumer and returns
// how many it deleted.
func (b *Inbox) ForgetPositions(ctx context.Context, consumer string) (int64, error) {
	tx, err := b.Driver.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("forgetting the positions of %s: %w", consumer, err)
	}
	defer rollback(ctx, tx)
	n, err := tx.Exec(ctx, b.D.ForgetPositions, b.D.Table.Quoted(), consumer)
	if err != nil {
		return 0, fmt.Errorf("forgetting the positions of %s: %w", consumer, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("forgetting the positions of %s: %w", consumer, err)
	}
	return n, nil
}
