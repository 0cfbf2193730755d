package mysqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idemstore"

	"github.com/idemkit/idem/idemstore/storetest"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pooltest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/sqlinbox"
)

// freshDB opens a database of its own for t (MySQL has no schemas:
// databases are the namespace), dropped when t ends.
func freshDB(t testing.TB) *sql.DB {
	t.Helper()
	db, _ := freshDBVia(t, nil)
	return db
}

// freshDBVia is freshDB, its connections going through a proxy to the
// server when via is set.
func freshDBVia(t testing.TB, via func(target string) string) (*sql.DB, string) {
	t.Helper()
	cfg := mysqltest.Database(t, "idem_t_")
	if via != nil {
		cfg.Addr = via(cfg.Addr)
		// The driver's timeout bounds the dial only; a silent server is
		// bounded by the read and write timeouts.
		cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, time.Second, time.Second
	}
	db, err := mysqlinbox.Open(cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db, cfg.DBName
}

func migrated(t testing.TB, db *sql.DB, cfg *sqlinbox.Config) *sqlinbox.Store {
	t.Helper()
	s, err := mysqlinbox.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// dialects are the dialects the test server takes: on MariaDB both, the
// MySQL dialect's statements being MySQL 8.0's syntax, which MariaDB
// accepts; on MySQL (IDEM_MYSQL_URL naming a MySQL server) the MySQL
// dialect only, as MariaDB's RETURNING and SET STATEMENT are not MySQL's.
func dialects(t testing.TB) []sqlinbox.Dialect {
	t.Helper()
	d, err := mysqlinbox.Detect(context.Background(), freshDB(t))
	if err != nil {
		t.Fatal(err)
	}
	if d == sqlinbox.MariaDB {
		return []sqlinbox.Dialect{sqlinbox.MySQL, sqlinbox.MariaDB}
	}
	return []sqlinbox.Dialect{sqlinbox.MySQL}
}

func migratedAs(t testing.TB, db *sql.DB, d sqlinbox.Dialect, cfg *sqlinbox.Config) *sqlinbox.Store {
	t.Helper()
	s, err := sqlinbox.New(db, d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// envDB is the conformance suite's environment on a fresh database whose
// pool has at most conns connections (0: database/sql's default).
func envDB(t *testing.T, d sqlinbox.Dialect, via func(string) string, conns int) (storetest.Env[*sql.Tx], *sql.DB) {
	db, _ := freshDBVia(t, via)
	pooltest.SQL(t, db, conns)
	return envOn(t, d, db), db
}

// envOn is the conformance suite's environment on db.
func envOn(t *testing.T, d sqlinbox.Dialect, db *sql.DB) storetest.Env[*sql.Tx] {
	ctx := context.Background()
	store := migratedAs(t, db, d, nil)
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (consumer VARBINARY(255), "key" VARBINARY(512), message_id VARBINARY(255))`); err != nil {
		t.Fatal(err)
	}
	return storetest.Env[*sql.Tx]{
		Store: store,
		Apply: func(ctx context.Context, tx *sql.Tx, consumer, key, id string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES (?, ?, ?)`, consumer, key, id)
			return err
		},
		Effects: func(ctx context.Context, consumer, key string) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE consumer = ? AND (? = '' OR "key" = ?)`, consumer, key, key).Scan(&n)
			return n, err
		},
		Markers: func(ctx context.Context, consumer string) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox WHERE consumer = ?`, consumer).Scan(&n)
			return n, err
		},
		Begin:    store.Begin,
		Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
	}
}

// TestConformanceInterpolated runs the shared inbox suite with the MySQL
// dialect on a database opened with interpolateParams=true, which Open
// keeps when the DSN asks for it: keys and IDs spliced into the text by the
// driver's escaping must claim exactly as parameters do.
func TestConformanceInterpolated(t *testing.T) {
	storetest.Run(t, storetest.Harness[*sql.Tx]{
		LockTimeout: true,
		Open: func(t *testing.T, conns int) storetest.Env[*sql.Tx] {
			dsn := mysqltest.Database(t, "idem_t_").FormatDSN()
			if strings.Contains(dsn, "?") {
				dsn += "&interpolateParams=true"
			} else {
				dsn += "?interpolateParams=true"
			}
			db, err := mysqlinbox.Open(dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			pooltest.SQL(t, db, conns)
			return envOn(t, sqlinbox.MySQL, db)
		},
	})
}

// TestConformance runs the shared inbox suite on MySQL/MariaDB.
func TestConformance(t *testing.T) {
	for _, d := range dialects(t) {
		t.Run(d.Name(), func(t *testing.T) {
			storetest.Run(t, storetest.Harness[*sql.Tx]{
				LockTimeout: true,
				Open:        func(t *testing.T, conns int) storetest.Env[*sql.Tx] { e, _ := envDB(t, d, nil, conns); return e },
				OpenBehindFault: func(t *testing.T, conns int) (storetest.Env[*sql.Tx], storetest.Fault) {
					var p *netfault.Proxy
					e, _ := envDB(t, d, func(target string) string {
						p = netfault.New(t, target)
						return p.Addr()
					}, conns)
					return e, p
				},
			})
		})
	}
}

// TestRetentionConformance runs the shared retention checks on MySQL, with
// both dialects: the MySQL dialect's prune (a SELECT ... FOR UPDATE of the
// batch's keys, then a DELETE of them: MySQL 8 has no DELETE ... RETURNING)
// and MariaDB's (one DELETE ... RETURNING) must delete and summarise alike.
func TestRetentionConformance(t *testing.T) {
	for _, d := range dialects(t) {
		t.Run(d.Name(), func(t *testing.T) {
			storetest.RunRetention(t, storetest.RetentionHarness[*sql.Tx]{Open: func(t *testing.T, conns int) storetest.RetentionEnv[*sql.Tx] {
				e, db := envDB(t, d, nil, conns)
				return storetest.RetentionEnv[*sql.Tx]{
					Env:   e,
					Store: e.Store.(*sqlinbox.Store),
					Reopen: func(t *testing.T, window time.Duration) storetest.RetentionStore[*sql.Tx] {
						s, err := sqlinbox.New(db, d, &sqlinbox.Config{Window: window})
						if err != nil {
							t.Fatal(err)
						}
						return s
					},
					SetTimes: func(ctx context.Context, consumer, key string, processedAt, keepUntil time.Time) error {
						_, err := db.ExecContext(ctx, `UPDATE idem_inbox SET processed_at = ?, keep_until = ? WHERE consumer = ? AND "key" = ?`,
							processedAt.UTC(), keepUntil.UTC(), consumer, key)
						return err
					},
				}
			}})
		})
	}
}

// TestKeysAreBytes: keys that a case- or accent-insensitive collation would
// take for one another are distinct markers, and keys with quotes,
// backslashes and bytes that are not UTF-8 are stored as they are, whether
// the driver sends them as parameters or splices them in
// (interpolateParams=true).
func TestKeysAreBytes(t *testing.T) {
	for _, d := range dialects(t) {
		for _, interpolate := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/interpolate=%v", d.Name(), interpolate), func(t *testing.T) {
				db := freshDB(t)
				if interpolate {
					cfg := mysqltest.Database(t, "idem_t_")
					cfg.InterpolateParams = true
					var err error
					if db, err = mysqlinbox.Open(cfg.FormatDSN()); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = db.Close() })
				}
				keysAreBytes(t, d, db)
			})
		}
	}
}

func keysAreBytes(t *testing.T, d sqlinbox.Dialect, db *sql.DB) {
	ctx := context.Background()
	s := migratedAs(t, db, d, nil)
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	keys := []string{"A", "a", "e", "é", "x ", "x", `a'b`, `a\'b`, `\`, `"q"`, "%_", "\x00\xff\xfe", "k\x00"}
	claims := make([]idemstore.Claim, len(keys))
	for i, k := range keys {
		claims[i] = idemstore.Claim{Key: k, MessageID: "m" + k}
	}
	got, err := s.Claim(ctx, tx, "c", claims, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range got {
		if !ok {
			t.Errorf("key %q was not inserted: a collation matched it to another", keys[i])
		}
	}
	again, err := s.Claim(ctx, tx, "c", claims, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range again {
		if ok {
			t.Errorf("key %q inserted twice", keys[i])
		}
	}
	ms, err := s.Lookup(ctx, tx, "c", keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if m, ok := ms[k]; !ok || m.MessageID != "m"+k {
			t.Errorf("lookup of %q: %+v, %v; want its marker", k, m, ok)
		}
	}
}

// TestNewDetectsMariaDB: mysqlinbox.New picks the dialect the server's
// version names.
func TestNewDetectsMariaDB(t *testing.T) {
	db := freshDB(t)
	s := migrated(t, db, nil)
	var v string
	if err := db.QueryRow("SELECT VERSION()").Scan(&v); err != nil {
		t.Fatal(err)
	}
	want := sqlinbox.MySQL
	if strings.Contains(strings.ToLower(v), "mariadb") {
		want = sqlinbox.MariaDB
	}
	if s.Dialect() != want {
		t.Errorf("server %s: dialect %v, want %v", v, s.Dialect(), want)
	}
}
