package sqlinbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore/storetest"
	"github.com/idemkit/idem/sqlinbox"
)

const sqliteTimeFormat = "2006-01-02T15:04:05.000000Z"

// TestRetentionConformance runs the shared retention checks on both
// dialects.
func TestRetentionConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			storetest.RunRetention(t, storetest.RetentionHarness[*sql.Tx]{Open: func(t *testing.T, conns int) storetest.RetentionEnv[*sql.Tx] {
				e, db := envDB(t, b, conns)
				store := e.Store.(*sqlinbox.Store)
				return storetest.RetentionEnv[*sql.Tx]{
					Env:   e,
					Store: store,
					Reopen: func(t *testing.T, window time.Duration) storetest.RetentionStore[*sql.Tx] {
						s, err := sqlinbox.New(db, b.dialect, &sqlinbox.Config{Window: window})
						if err != nil {
							t.Fatal(err)
						}
						return s
					},
					SetTimes: func(ctx context.Context, consumer, key string, processedAt, keepUntil time.Time) error {
						q := `UPDATE idem_inbox SET processed_at = $3, keep_until = $4 WHERE consumer = $1 AND key = $2`
						var at, until any = processedAt, keepUntil
						if b.dialect == sqlinbox.SQLite {
							q = `UPDATE idem_inbox SET processed_at = ?3, keep_until = ?4 WHERE consumer = ?1 AND key = ?2`
							at, until = processedAt.UTC().Format(sqliteTimeFormat), keepUntil.UTC().Format(sqliteTimeFormat)
						}
						_, err := db.ExecContext(ctx, q, consumer, key, at, until)
						return err
					},
				}
			}})
		})
	}
}
