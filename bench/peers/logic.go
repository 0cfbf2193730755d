package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/pgxinbox"
)

// The three database disciplines every broker's consumers share, so that a
// broker's rows differ only in how they consume: no guard, the inbox SQL by
// hand (per message and batched), and idem.

// NaiveBatch applies a batch's effects with no guard: the ceiling, and what
// a redelivery turns into a double effect.
func NaiveBatch(ctx context.Context, pool *pgxpool.Pool, consumer string, msgs []Msg) error {
	es := make([]Effect, len(msgs))
	for i, m := range msgs {
		var err error
		if es[i], err = Decode(m.ID, m.Body); err != nil {
			return err
		}
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ApplyBatch(ctx, tx, consumer, es) })
}

// HandOne is the inbox SQL by hand, one transaction per message: claim the
// ID, apply only when the claim inserted, commit.
func HandOne(ctx context.Context, pool *pgxpool.Pool, consumer string, m Msg) error {
	e, err := Decode(m.ID, m.Body)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO processed_events (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, consumer, m.ID)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		return ApplyOne(ctx, tx, consumer, e)
	})
}

// HandBatch is the best batched inbox a team writes by hand: one claim of
// the batch's distinct IDs in sorted order (concurrent batches lock in the
// same order), the effects of the IDs it inserted in one round trip, one
// commit.
func HandBatch(ctx context.Context, pool *pgxpool.Pool, consumer string, msgs []Msg) error {
	return handBatch(ctx, pool, "processed_events", consumer, msgs)
}

// HandBatchPrunable is HandBatch on an inbox with an index on
// processed_at, which a prune by age needs.
func HandBatchPrunable(ctx context.Context, pool *pgxpool.Pool, consumer string, msgs []Msg) error {
	return handBatch(ctx, pool, "processed_events_prunable", consumer, msgs)
}

func handBatch(ctx context.Context, pool *pgxpool.Pool, table, consumer string, msgs []Msg) error {
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `INSERT INTO `+table+` (consumer, message_id)
SELECT $1, id FROM unnest($2::text[]) AS id ORDER BY id
ON CONFLICT DO NOTHING RETURNING message_id`, consumer, ids)
		if err != nil {
			return err
		}
		won := make(map[string]bool, len(ids))
		var id string
		if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { won[id] = true; return nil }); err != nil {
			return err
		}
		es := make([]Effect, 0, len(won))
		for _, m := range msgs {
			if !won[m.ID] {
				continue
			}
			won[m.ID] = false // a copy within the batch is applied once
			e, err := Decode(m.ID, m.Body)
			if err != nil {
				return err
			}
			es = append(es, e)
		}
		return ApplyBatch(ctx, tx, consumer, es)
	})
}

// quiet is the logger of the idem consumers: the hand-written ones log
// nothing either.
var quiet = slog.New(slog.DiscardHandler)

// Inbox is the idem inbox every idem consumer of the benchmark claims in.
func Inbox(ctx context.Context, pool *pgxpool.Pool) (*pgxinbox.Store, error) {
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Logger: quiet})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("migrating the inbox: %w", err)
	}
	return store, nil
}

// Processor is the idem processor of a run: the same effect through
// idem.JSON (per message) or idem.JSONBatch (batched).
func Processor(store *pgxinbox.Store, consumer string, batched bool) (*idem.Processor[pgx.Tx], error) {
	cfg := &idem.Config[pgx.Tx]{Consumer: consumer, Key: idem.ByMessageID, Logger: quiet}
	if batched {
		cfg.HandleBatch = idem.JSONBatch(func(ctx context.Context, tx pgx.Tx, msgs []idem.Message, cs []Credit) error {
			es := make([]Effect, len(msgs))
			for i, m := range msgs {
				es[i] = Effect{ID: m.ID, Credit: cs[i]}
			}
			return ApplyBatch(ctx, tx, consumer, es)
		})
	} else {
		cfg.Handler = idem.JSON(func(ctx context.Context, tx pgx.Tx, m idem.Message, c Credit) error {
			return ApplyOne(ctx, tx, consumer, Effect{ID: m.ID, Credit: c})
		})
	}
	return idem.NewProcessor(store, cfg)
}
