package idemredis_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/pgxinbox"
)

// inbox is a migrated pgxinbox store on the schema at url, and an effects
// table with no unique constraint: an effect applied twice is two rows.
func inbox(t testing.TB, url string) (*pgxpool.Pool, *pgxinbox.Store) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return inboxOn(t, pool)
}

// inboxOn is inbox on a pool.
func inboxOn(t testing.TB, pool *pgxpool.Pool) (*pgxpool.Pool, *pgxinbox.Store) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS effects (seq bigserial PRIMARY KEY, message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return pool, store
}

// processor writes one effects row per message applied.
func processor(t testing.TB, store *pgxinbox.Store, hooks ...idem.Hook) *idem.Processor[pgx.Tx] {
	t.Helper()
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "redis-test",
		Key:      idem.ByMessageID,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, m.ID)
			return err
		},
		Retry: idem.RetryPolicy{
			MaxAttempts: 3, Backoff: idem.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
			WaitUnavailable: 500 * time.Millisecond,
		},
		TxTimeout: 5 * time.Second, CommitTimeout: 5 * time.Second,
		Logger: quiet(t),
		Hooks:  hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// quiet logs warnings and worse to stderr, for a child process, or drops
// them.
func quiet(testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// effects counts the effects rows by message ID.
func effects(t testing.TB, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT message_id FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, id := range ids {
		out[id]++
	}
	return out
}

// publish XADDs n entries with IDs prefix-000.. and returns the IDs.
func publish(t testing.TB, rdb redis.Cmdable, stream, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{
			idemredis.DefaultIDField, ids[i], idemredis.DefaultBodyField, "body of " + ids[i],
		}}).Err(); err != nil {
			t.Fatalf("XADD: %v", err)
		}
	}
	return ids
}

// waitFor polls cond every 50ms for up to d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run runs c until the test ends and returns a stop that cancels it and
// returns Run's error.
func run(t testing.TB, c interface{ Run(context.Context) error }) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return within 30s of its cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// pending is the number of entries pending in the group.
func pending(t testing.TB, rdb redis.Cmdable, stream, group string) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}
