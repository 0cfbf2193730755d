package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// predictEnv is a store with what the prediction test needs of its
// database: making a marker old enough to prune, and pruning.
type predictEnv[TTx any] struct {
	store idemstore.Store[TTx]
	// age makes key's marker older than the window.
	age func(t *testing.T, key string)
	// prune prunes with the stored window.
	prune func(t *testing.T)
	// markers counts the inbox's rows.
	markers func(t *testing.T) int
}

// TestPredictAgreesWithProcess: for each way a message can go — applied,
// duplicate, a blank, invalid UTF-8 or NUL key, expired, a late duplicate
// refused or applied again — Predict says what Process then does, and
// writes nothing itself, on pgxinbox and on sqlinbox's SQLite, MySQL (or
// MariaDB) and PostgreSQL.
func TestPredictAgreesWithProcess(t *testing.T) {
	t.Parallel()
	t.Run("pgxinbox", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := pgtest.Pool(t)
		store, err := pgxinbox.New(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		testPredict(t, predictEnv[pgx.Tx]{
			store: store,
			age: func(t *testing.T, key string) {
				if _, err := pool.Exec(ctx, `UPDATE idem_inbox SET processed_at = now() - interval '400 days', keep_until = now() - interval '400 days' WHERE key = $1`, key); err != nil {
					t.Fatal(err)
				}
			},
			prune: func(t *testing.T) {
				if res, err := store.Prune(ctx, pgxinbox.PruneOptions{}); err != nil || res.Markers != 1 {
					t.Fatalf("prune: %+v %v, want 1 marker", res, err)
				}
			},
			markers: func(t *testing.T) int {
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			},
		})
	})
	sqlEnv := func(t *testing.T, db *sql.DB, d sqlinbox.Dialect, ph func(int) string, ts func(time.Time) any) predictEnv[*sql.Tx] {
		ctx := context.Background()
		var store *sqlinbox.Store
		var err error
		if d == nil {
			store, err = mysqlinbox.New(db, nil)
		} else {
			store, err = sqlinbox.New(db, d, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		quotedKey := "key"
		if d == nil {
			quotedKey = `"key"` // ANSI_QUOTES, as mysqlinbox.Open sets
		}
		return predictEnv[*sql.Tx]{
			store: store,
			age: func(t *testing.T, key string) {
				old := ts(time.Now().Add(-400 * 24 * time.Hour))
				if _, err := db.ExecContext(ctx, `UPDATE idem_inbox SET processed_at = `+ph(1)+`, keep_until = `+ph(2)+` WHERE `+quotedKey+` = `+ph(3), old, old, key); err != nil {
					t.Fatal(err)
				}
			},
			prune: func(t *testing.T) {
				if res, err := store.Prune(ctx, retention.Options{}); err != nil || res.Markers != 1 {
					t.Fatalf("prune: %+v %v, want 1 marker", res, err)
				}
			},
			markers: func(t *testing.T) int {
				var n int
				if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			},
		}
	}
	t.Run("sqlinbox-sqlite", func(t *testing.T) {
		t.Parallel()
		db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "inbox.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		testPredict(t, sqlEnv(t, db, sqlinbox.SQLite,
			func(n int) string { return "?" },
			func(tm time.Time) any { return tm.UTC().Format("2006-01-02T15:04:05.000000Z") }))
	})
	t.Run("sqlinbox-mysql", func(t *testing.T) {
		t.Parallel()
		cfg := mysqltest.Database(t, "idem_predict_")
		db, err := mysqlinbox.Open(cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		testPredict(t, sqlEnv(t, db, nil,
			func(int) string { return "?" },
			func(tm time.Time) any { return tm.UTC() }))
	})
	t.Run("sqlinbox-postgres", func(t *testing.T) {
		t.Parallel()
		db, err := sql.Open("pgx", pgtest.Schema(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		testPredict(t, sqlEnv(t, db, sqlinbox.Postgres,
			func(n int) string { return "$" + string(rune('0'+n)) },
			func(tm time.Time) any { return tm }))
	})
}

func testPredict[TTx any](t *testing.T, env predictEnv[TTx]) {
	ctx := context.Background()
	newProc := func(refuseLate bool) *idem.Processor[TTx] {
		p, err := idem.NewProcessor(env.store, &idem.Config[TTx]{
			Consumer:   "predict",
			Key:        func(m idem.Message) (string, error) { return m.Headers["key"], nil },
			Handler:    func(context.Context, TTx, idem.Message) error { return nil },
			RefuseLate: refuseLate,
			Logger:     slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	lax, strict := newProc(false), newProc(true)
	msg := func(id, key string, at time.Time) idem.Message {
		m := idem.Message{ID: id, Headers: map[string]string{"key": key}, Body: []byte(id)}
		if !at.IsZero() {
			m.Time, m.TimeSource = at, idem.TimeFromBroker
		}
		return m
	}
	// agree predicts m on p, checks the prediction, then processes m and
	// checks that Process did the same.
	agree := func(name string, p *idem.Processor[TTx], m idem.Message, want idem.Outcome, wantErr error, late bool) {
		t.Helper()
		before := env.markers(t)
		pr, err := p.Predict(ctx, m)
		if err != nil {
			t.Fatalf("%s: predict: %v", name, err)
		}
		// PredictBatch gives the same answer, for each copy in a batch.
		bs, err := p.PredictBatch(ctx, []idem.Message{m, m})
		if err != nil {
			t.Fatalf("%s: predict batch: %v", name, err)
		}
		for i, b := range bs {
			if b.Outcome != pr.Outcome || b.Key != pr.Key || !b.PrunedOn.Equal(pr.PrunedOn) || (b.Err == nil) != (pr.Err == nil) || (b.First == nil) != (pr.First == nil) {
				t.Errorf("%s: batch copy %d predicted %s key %q (%v), Predict %s key %q (%v)", name, i, b.Outcome, b.Key, b.Err, pr.Outcome, pr.Key, pr.Err)
			}
		}
		if n := env.markers(t); n != before {
			t.Fatalf("%s: predict changed the inbox: %d markers, %d before", name, n, before)
		}
		if pr.Outcome != want || (wantErr != nil && !errors.Is(pr.Err, wantErr)) || !pr.PrunedOn.IsZero() != late {
			t.Errorf("%s: predicted %s (%v, pruned on %v), want %s (%v, late %v)", name, pr.Outcome, pr.Err, pr.PrunedOn, want, wantErr, late)
		}
		got := p.Process(ctx, m)
		if got.Outcome != pr.Outcome || got.Key != pr.Key || !got.PrunedOn.Equal(pr.PrunedOn) || (got.Err == nil) != (pr.Err == nil) {
			t.Errorf("%s: predicted %s key %q (%v, pruned on %v), Process gave %s key %q (%v, pruned on %v)", name,
				pr.Outcome, pr.Key, pr.Err, pr.PrunedOn, got.Outcome, got.Key, got.Err, got.PrunedOn)
		}
		if pr.Outcome == idem.Duplicate && (pr.First == nil || got.First == nil || pr.First.MessageID != got.First.MessageID) {
			t.Errorf("%s: predicted marker %+v, Process met %+v", name, pr.First, got.First)
		}
	}
	now := time.Now()
	agree("apply", lax, msg("m-1", "k-1", now), idem.Applied, nil, false)
	agree("duplicate", lax, msg("m-2", "k-1", now), idem.Duplicate, nil, false)
	agree("blank key", lax, msg("m-3", "  ", now), idem.DeadLettered, idem.ErrBadKey, false)
	agree("empty key", lax, msg("m-4", "", now), idem.DeadLettered, idem.ErrBadKey, false)
	agree("invalid UTF-8 key", lax, msg("m-5", "k-\xff", now), idem.DeadLettered, idem.ErrBadKey, false)
	agree("NUL key", lax, msg("m-6", "k-\x00", now), idem.DeadLettered, idem.ErrBadKey, false)
	agree("no ID", lax, msg("", "k-7", now), idem.DeadLettered, idem.ErrNoMessageID, false)
	agree("expired", lax, msg("m-8", "k-8", now.Add(-365*24*time.Hour)), idem.Expired, idem.ErrExpired, false)

	// A late duplicate: the key's marker pruned, the message untimed (a
	// horizon cannot judge it), so only the summary tells.
	agree("first of late", lax, msg("m-9", "k-late", time.Time{}), idem.Applied, nil, false)
	env.age(t, "k-late")
	env.prune(t)
	for _, p := range []*idem.Processor[TTx]{lax, strict} {
		if err := p.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	agree("late refused", strict, msg("m-10", "k-late", time.Time{}), idem.Expired, idem.ErrMarkerPruned, true)
	agree("late applied", lax, msg("m-11", "k-late", time.Time{}), idem.Applied, nil, true)
	// The refusing consumer refuses the key before it claims, marker or
	// not, and the prediction says so too.
	agree("after late", strict, msg("m-12", "k-late", time.Time{}), idem.Expired, idem.ErrMarkerPruned, true)
	agree("after late, lax", lax, msg("m-13", "k-late", time.Time{}), idem.Duplicate, nil, false)
}
