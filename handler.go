package idem

import (
	"context"
	"encoding/json"
	"fmt"
)

// Handler applies the effect of one message inside tx, the same transaction
// that holds the message's inbox claim. TTx is the store's transaction type,
// so pgx, database/sql and sqlc code runs in it unchanged. Return
// [Permanent] for errors no retry can fix; any other error is retried.
// A handler must not commit or roll back tx.
type Handler[TTx any] func(ctx context.Context, tx TTx, msg Message) error

// BatchHandler applies the effects of several messages inside tx, in the
// order given. See Config.HandleBatch.
type BatchHandler[TTx any] func(ctx context.Context, tx TTx, msgs []Message) error

// JSON adapts a handler that takes the body decoded from JSON into T. A body
// that does not decode is a permanent error: the message is dead-lettered.
func JSON[T any, TTx any](h func(ctx context.Context, tx TTx, msg Message, v T) error) Handler[TTx] {
	return func(ctx context.Context, tx TTx, msg Message) error {
		var v T
		if err := json.Unmarshal(msg.Body, &v); err != nil {
			return Permanent(fmt.Errorf("decoding %T: %w", v, err))
		}
		return h(ctx, tx, msg, v)
	}
}

// JSONBatch adapts a batch handler that takes every body decoded from JSON
// into T: vs[i] is msgs[i]'s body. A body that does not decode fails the
// whole batch with a permanent error naming that message; the processor
// then tries the batch's messages one by one, so the others are applied
// and only that one is dead-lettered, as [JSON] would.
func JSONBatch[T any, TTx any](h func(ctx context.Context, tx TTx, msgs []Message, vs []T) error) BatchHandler[TTx] {
	return func(ctx context.Context, tx TTx, msgs []Message) error {
		vs := make([]T, len(msgs))
		for i, msg := range msgs {
			if err := json.Unmarshal(msg.Body, &vs[i]); err != nil {
				return Permanent(fmt.Errorf("decoding message %s as %T: %w", msg.ID, vs[i], err))
			}
		}
		return h(ctx, tx, msgs, vs)
	}
}
