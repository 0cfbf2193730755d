package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// A 1-hour inbox in front of a stream holding 7-day-old entries is refused
// at start with both numbers: a group reset (XGROUP SETID) would replay
// entries whose markers are gone. A declared retention longer than the
// window is refused the same way; AcceptReplayPastWindow lets it run, and
// the old entries are applied once.
func TestRefusesStreamOlderThanWindow(t *testing.T) {
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	pool, store := inbox(t, pgtest.Schema(t))
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "redis-replay-test",
		Key:      idem.ByMessageID,
		Horizon:  idem.Horizon{Window: time.Hour},
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, m.ID)
			return err
		},
		Logger: quiet(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old := time.Now().Add(-7 * 24 * time.Hour).UnixMilli()
	for i := range 3 {
		// Entry IDs 7 days back; the event time the producer gives is
		// now, so that the horizon guard does not decide for the check.
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("%d-%d", old, i), Values: []any{
			idemredis.DefaultIDField, fmt.Sprintf("old-%d", i), idemredis.DefaultBodyField, "b",
			idemredis.DefaultTimeField, time.Now().UTC().Format(time.RFC3339Nano),
		}}).Err(); err != nil {
			t.Fatalf("XADD with an ID in the past: %v", err)
		}
	}
	newC := func(cfg idemredis.Config) *idemredis.Consumer[pgx.Tx] {
		cfg.Stream, cfg.Group, cfg.GroupStart, cfg.CreateDeadLetterStream, cfg.Logger = stream, "g", "0", true, quiet(t)
		cfg.Block, cfg.ClaimIdle = 200*time.Millisecond, 2*time.Second
		c, err := idemredis.New(rdb, proc, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	err = refusedWithin(t, newC(idemredis.Config{}))
	t.Logf("refused: %v", err)
	if !errors.Is(err, idemredis.ErrConfig) || !strings.Contains(err.Error(), "168h0m") || !strings.Contains(err.Error(), "1h0m0s") {
		t.Errorf("Run in front of 7-day-old entries with a 1-hour inbox = %v; want ErrConfig naming 168h and 1h0m0s", err)
	}
	err = refusedWithin(t, newC(idemredis.Config{MaxAge: 24 * time.Hour}))
	if !errors.Is(err, idemredis.ErrConfig) || !strings.Contains(err.Error(), "24h0m0s") || !strings.Contains(err.Error(), "1h0m0s") {
		t.Errorf("Run with a declared retention of a day and a 1-hour inbox = %v; want ErrConfig naming 24h0m0s and 1h0m0s", err)
	}
	if n := pending(t, rdb, stream, "g"); n != 0 {
		t.Errorf("%d entries pending after the refusals; want none read", n)
	}

	stop := run(t, newC(idemredis.Config{AcceptReplayPastWindow: true}))
	waitFor(t, 60*time.Second, "the old entries applied", func() bool { return len(effects(t, pool)) == 3 })
	waitFor(t, 60*time.Second, "the old entries acked", func() bool { return pending(t, rdb, stream, "g") == 0 })
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	for id, n := range effects(t, pool) {
		if n != 1 {
			t.Errorf("%s applied %d times; want once", id, n)
		}
	}
}
