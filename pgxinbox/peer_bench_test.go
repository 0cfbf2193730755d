package pgxinbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// peerAccounts is how many accounts the messages move money between.
const peerAccounts = 1000

// peerBody is a message's body: an amount for an account.
type peerBody struct {
	Account int32 `json:"account"`
	Amount  int64 `json:"amount"`
}

// The effect, the same for every contender: the account's balance moves and
// one effect row per message records it. Batched, both go as one set-based
// statement each, the balances updated in account order.
const (
	peerUpdateOne = `UPDATE accounts SET balance = balance + $2 WHERE id = $1`
	peerInsertOne = `INSERT INTO effects (consumer, message_id, account, amount) VALUES ($1, $2, $3, $4)`
	peerUpdateSet = `UPDATE accounts AS a SET balance = a.balance + s.amount
FROM (SELECT account, sum(amount) AS amount FROM unnest($1::int[], $2::bigint[]) AS u(account, amount)
      GROUP BY account ORDER BY account) AS s
WHERE a.id = s.account`
	peerInsertSet = `INSERT INTO effects (consumer, message_id, account, amount)
SELECT $1, m, a, v FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(m, a, v)`
	// The hand-rolled inbox: a marker table and one claim statement.
	peerClaimSet = `INSERT INTO processed_events (consumer, message_id)
SELECT $1, id FROM unnest($2::text[]) AS id ORDER BY id
ON CONFLICT DO NOTHING RETURNING message_id`
	peerClaimOne = `INSERT INTO processed_events (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`
)

// peerEffectSet applies the batched effect of msgs inside tx.
func peerEffectSet(ctx context.Context, tx pgx.Tx, consumer string, msgs []idem.Message) error {
	ids := make([]string, len(msgs))
	accounts := make([]int32, len(msgs))
	amounts := make([]int64, len(msgs))
	for i, m := range msgs {
		var v peerBody
		if err := json.Unmarshal(m.Body, &v); err != nil {
			return idem.Permanent(err)
		}
		ids[i], accounts[i], amounts[i] = m.ID, v.Account, v.Amount
	}
	if _, err := tx.Exec(ctx, peerUpdateSet, accounts, amounts); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, peerInsertSet, consumer, ids, accounts, amounts)
	return err
}

// peerEffectOne applies one message's effect inside tx.
func peerEffectOne(ctx context.Context, tx pgx.Tx, consumer string, m idem.Message) error {
	var v peerBody
	if err := json.Unmarshal(m.Body, &v); err != nil {
		return idem.Permanent(err)
	}
	if _, err := tx.Exec(ctx, peerUpdateOne, v.Account, v.Amount); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, peerInsertOne, consumer, m.ID, v.Account, v.Amount)
	return err
}

// handRolledBatch is the inbox a team writes by hand: one claim of the
// batch's IDs in sorted order, the effect of the ones it won, commit.
func handRolledBatch(ctx context.Context, pool *pgxpool.Pool, consumer string, msgs []idem.Message) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	rows, err := tx.Query(ctx, peerClaimSet, consumer, ids)
	if err != nil {
		return 0, err
	}
	won := make(map[string]struct{}, len(msgs))
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		won[id] = struct{}{}
		return nil
	}); err != nil {
		return 0, err
	}
	fresh := make([]idem.Message, 0, len(won))
	for _, m := range msgs {
		if _, ok := won[m.ID]; ok {
			fresh = append(fresh, m)
			delete(won, m.ID) // an ID twice in the batch is applied once
		}
	}
	if len(fresh) > 0 {
		if err := peerEffectSet(ctx, tx, consumer, fresh); err != nil {
			return 0, err
		}
	}
	return len(fresh), tx.Commit(ctx)
}

// handRolledOne is the hand-rolled inbox for one message.
func handRolledOne(ctx context.Context, pool *pgxpool.Pool, consumer string, m idem.Message) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, peerClaimOne, consumer, m.ID)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	if err := peerEffectOne(ctx, tx, consumer, m); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// BenchmarkVersusHandRolled measures idem's database path against the inbox
// a team would write by hand, with the identical effect (a balance update
// and one effect row per message), batched and one message per
// transaction, in the same run; no broker. Each idem sub-benchmark reports
// its speed as a ratio of the hand-rolled one just before it:
//
//	go test -run '^$' -bench VersusHandRolled -benchtime 3s -count 3 ./pgxinbox/
func BenchmarkVersusHandRolled(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.Pool(b)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
INSERT INTO accounts (id) SELECT generate_series(0, `+fmt.Sprint(peerAccounts-1)+`);
CREATE TABLE effects (consumer text NOT NULL, message_id text NOT NULL, account int NOT NULL, amount bigint NOT NULL);
CREATE TABLE processed_events (
    consumer     text NOT NULL,
    message_id   text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
)`); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	next := func() idem.Message {
		now := time.Now()
		id := idem.NewUUIDv7(now)
		at, src := idem.EventTime(id, time.Time{}, now)
		body := fmt.Appendf(nil, `{"account":%d,"amount":%d}`, rng.IntN(peerAccounts), 1+rng.IntN(1000))
		return idem.Message{ID: id, Body: body, Time: at, TimeSource: src}
	}
	// sent counts the messages each consumer was given, to check the
	// effect rows against at the end.
	sent := map[string]int{}
	b.Cleanup(func() {
		for consumer, n := range sent {
			var rows int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE consumer = $1`, consumer).Scan(&rows); err != nil {
				b.Error(err)
			} else if rows != n {
				b.Errorf("consumer %s: %d effect rows for %d messages", consumer, rows, n)
			}
		}
	})
	var handRolled float64 // msgs/s of the last hand-rolled run
	report := func(b *testing.B, n int, idemRun bool) {
		rate := float64(n) / b.Elapsed().Seconds()
		b.ReportMetric(rate, "msgs/s")
		switch {
		case !idemRun:
			handRolled = rate
		case handRolled > 0:
			b.ReportMetric(rate/handRolled, "x_handrolled")
		}
	}
	seq := 0
	newConsumer := func(kind string) string {
		seq++
		c := fmt.Sprintf("%s-%d", kind, seq)
		sent[c] = 0
		return c
	}
	newProcessor := func(b *testing.B, consumer string, batch bool) *idem.Processor[pgx.Tx] {
		cfg := &idem.Config[pgx.Tx]{Consumer: consumer, Key: idem.ByMessageID}
		if batch {
			cfg.HandleBatch = func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
				return peerEffectSet(ctx, tx, consumer, msgs)
			}
		} else {
			cfg.Handler = func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
				return peerEffectOne(ctx, tx, consumer, m)
			}
		}
		p, err := idem.NewProcessor(store, cfg)
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	const batch = 100
	b.Run(fmt.Sprintf("handrolled/batch=%d", batch), func(b *testing.B) {
		consumer := newConsumer("hand")
		msgs := make([]idem.Message, batch)
		n := 0
		for b.Loop() {
			for i := range msgs {
				msgs[i] = next()
			}
			applied, err := handRolledBatch(ctx, pool, consumer, msgs)
			if err != nil {
				b.Fatal(err)
			}
			if applied != batch {
				b.Fatalf("%d of %d messages applied", applied, batch)
			}
			n += batch
		}
		sent[consumer] += n
		report(b, n, false)
	})
	b.Run(fmt.Sprintf("idem/batch=%d", batch), func(b *testing.B) {
		consumer := newConsumer("idem")
		p := newProcessor(b, consumer, true)
		msgs := make([]idem.Message, batch)
		n := 0
		for b.Loop() {
			for i := range msgs {
				msgs[i] = next()
			}
			for _, r := range p.ProcessBatch(ctx, msgs) {
				if r.Outcome != idem.Applied {
					b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
				}
			}
			n += batch
		}
		sent[consumer] += n
		report(b, n, true)
	})
	b.Run("handrolled/batch=1", func(b *testing.B) {
		consumer := newConsumer("hand")
		n := 0
		for b.Loop() {
			applied, err := handRolledOne(ctx, pool, consumer, next())
			if err != nil {
				b.Fatal(err)
			}
			if !applied {
				b.Fatal("message not applied")
			}
			n++
		}
		sent[consumer] += n
		report(b, n, false)
	})
	b.Run("idem/batch=1", func(b *testing.B) {
		consumer := newConsumer("idem")
		p := newProcessor(b, consumer, false)
		n := 0
		for b.Loop() {
			if r := p.Process(ctx, next()); r.Outcome != idem.Applied {
				b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
			}
			n++
		}
		sent[consumer] += n
		report(b, n, true)
	})
	// interleaved: the two contenders take turns, one transaction each,
	// the first of the pair alternating, and each one's time is kept apart,
	// so a load that comes and goes on a shared machine weighs on both
	// alike. x_handrolled is idem's speed over the hand-rolled one's from
	// the total times; x_median from the median transaction times, which a
	// stall of a few transactions does not move.
	for _, size := range []int{batch, 1} {
		b.Run(fmt.Sprintf("interleaved/batch=%d", size), func(b *testing.B) {
			hand, mine := newConsumer("hand"), newConsumer("idem")
			p := newProcessor(b, mine, size > 1)
			msgs := make([]idem.Message, size)
			runHand := func() time.Duration {
				for i := range msgs {
					msgs[i] = next()
				}
				start := time.Now()
				if size == 1 {
					applied, err := handRolledOne(ctx, pool, hand, msgs[0])
					if err != nil || !applied {
						b.Fatalf("hand-rolled: applied %v, %v", applied, err)
					}
				} else if applied, err := handRolledBatch(ctx, pool, hand, msgs); err != nil || applied != size {
					b.Fatalf("hand-rolled: %d of %d applied, %v", applied, size, err)
				}
				return time.Since(start)
			}
			runIdem := func() time.Duration {
				for i := range msgs {
					msgs[i] = next()
				}
				start := time.Now()
				if size == 1 {
					if r := p.Process(ctx, msgs[0]); r.Outcome != idem.Applied {
						b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
					}
				} else {
					for _, r := range p.ProcessBatch(ctx, msgs) {
						if r.Outcome != idem.Applied {
							b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
						}
					}
				}
				return time.Since(start)
			}
			var handTimes, idemTimes []time.Duration
			var handTime, idemTime time.Duration
			n := 0
			for b.Loop() {
				var h, m time.Duration
				if len(handTimes)%2 == 0 {
					h, m = runHand(), runIdem()
				} else {
					m, h = runIdem(), runHand()
				}
				handTimes, idemTimes = append(handTimes, h), append(idemTimes, m)
				handTime, idemTime = handTime+h, idemTime+m
				n += size
			}
			sent[hand] += n
			sent[mine] += n
			b.ReportMetric(float64(n)/handTime.Seconds(), "hand_msgs/s")
			b.ReportMetric(float64(n)/idemTime.Seconds(), "idem_msgs/s")
			b.ReportMetric(handTime.Seconds()/idemTime.Seconds(), "x_handrolled")
			b.ReportMetric(float64(median(handTimes))/float64(median(idemTimes)), "x_median")
		})
	}
}

// median returns the median of ds, which it sorts.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
