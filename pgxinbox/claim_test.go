package pgxinbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/pgxinbox"
)

// TestClaimSetsLockTimeout: the claim statement sets the lock timeout
// before it inserts, so a claim of one key and a claim of a batch whose
// last key is held both give up after the timeout instead of waiting for
// the holder, and the setting holds for the rest of the transaction. With
// no lock timeout nothing is set.
func TestClaimSetsLockTimeout(t *testing.T) {
	t.Parallel()
	for _, layout := range []pgxinbox.Layout{pgxinbox.Plain, pgxinbox.Partitioned} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, store := openLayout(t, layout, nil)
			now := time.Now()
			claim := func(key string) idemstore.Claim {
				return idemstore.Claim{Key: key, MessageID: key, BodySHA256: idem.BodyHash([]byte(key)), EventTime: now, PartitionTime: now}
			}
			holder, err := store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(ctx) }()
			if _, err := store.Claim(ctx, holder, "ledger", []idemstore.Claim{claim("k9-held")}, time.Second); err != nil {
				t.Fatal(err)
			}
			for _, claims := range [][]idemstore.Claim{
				{claim("k9-held")},
				{claim("k1"), claim("k2"), claim("k9-held")},
			} {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				tx, err := store.Begin(wctx)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				_, err = store.Claim(wctx, tx, "ledger", claims, 50*time.Millisecond)
				waited := time.Since(start)
				_ = tx.Rollback(ctx)
				cancel()
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || waited > 5*time.Second {
					t.Fatalf("claim of %d keys behind a held key: %v after %v, want lock_timeout (55P03)", len(claims), err, waited)
				}
			}
			for _, n := range []int{1, 3} {
				for _, lock := range []time.Duration{0, 1500 * time.Millisecond} {
					tx, err := store.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					claims := make([]idemstore.Claim, n)
					for i := range claims {
						claims[i] = claim(fmt.Sprintf("s-%d-%v-%d", n, lock, i))
					}
					ins, err := store.Claim(ctx, tx, "ledger", claims, lock)
					if err != nil {
						t.Fatal(err)
					}
					for i, ok := range ins {
						if !ok {
							t.Errorf("claim %d of %d not inserted", i, n)
						}
					}
					var got string
					if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&got); err != nil {
						t.Fatal(err)
					}
					want := "0"
					if lock > 0 {
						want = "1500ms"
					}
					if got != want {
						t.Errorf("%d claims with lock timeout %v: lock_timeout in the transaction is %q, want %q", n, lock, got, want)
					}
					_ = tx.Rollback(ctx)
				}
			}
		})
	}
}

// TestClaimRecordsMessageID: a claim records the message ID that won,
// whether it is the key (the claim then sends it once) or another, alone
// and in a batch.
func TestClaimRecordsMessageID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, store := openLayout(t, pgxinbox.Plain, nil)
	for _, claims := range [][]idemstore.Claim{
		{{Key: "one-same", MessageID: "one-same"}},
		{{Key: "one-other", MessageID: "m-one-other"}},
		{{Key: "b-same", MessageID: "b-same"}, {Key: "b-other", MessageID: "m-b-other"}, {Key: "b-same2", MessageID: "b-same2"}},
	} {
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ins, err := store.Claim(ctx, tx, "ledger", claims, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		keys := make([]string, len(claims))
		for i, c := range claims {
			keys[i] = c.Key
			if !ins[i] {
				t.Errorf("claim of %s not inserted", c.Key)
			}
		}
		markers, err := store.Lookup(ctx, tx, "ledger", keys)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range claims {
			m, ok := markers[c.Key]
			if !ok || m.MessageID != c.MessageID || len(m.BodySHA256) != 0 {
				t.Errorf("marker of %s: %+v (found %v), want message ID %s and an empty hash", c.Key, m, ok, c.MessageID)
			}
		}
		if err := store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
}
