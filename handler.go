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
