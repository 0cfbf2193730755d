package idemmigrate_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem/dlq"
	"github.com/idemkit/idem/idemkey"
	"github.com/idemkit/idem/idemmigrate"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/pgxinbox"
)

// deadline bounds every test's database work: generous, so that a loaded
// machine is not a failure, and a wait for itself fails instead of hanging.
const deadline = 2 * time.Minute

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// engine is one database under test: how to open a pool on it (maxConns 0:
// the driver's default), and how to ask whether a table exists.
type engine struct {
	name   idemmigrate.Engine
	newM   func(t *testing.T, maxConns int, cfg *idemmigrate.Config) *idemmigrate.Migrator
	exists func(t *testing.T, table string) bool
	exec   func(t *testing.T, stmt string)
	// versions is the version table: table_name → version.
	versions func(t *testing.T) map[string]int
	// pg opens a pool (PostgreSQL only).
	pg func(maxConns int) *pgxpool.Pool
}

// tables are the tables every component's migration creates, per engine.
var tables = map[idemmigrate.Engine][]string{
	idemmigrate.Postgres: {"idem_inbox", "idem_migrations", "idem_inbox_settings", "idem_inbox_horizons", "idem_inbox_pruned", "idem_inbox_positions",
		"idem_outbox", "idem_outbox_leases", "idem_outbox_relays", "idem_outbox_meta",
		"idem_idempotency_keys", "idem_inbox_retired", "idem_dlq_actions"},
	idemmigrate.SQLite: {"idem_inbox", "idem_migrations", "idem_inbox_settings", "idem_inbox_horizons", "idem_inbox_pruned", "idem_inbox_positions",
		"idem_outbox", "idem_outbox_leases", "idem_outbox_relays", "idem_outbox_meta"},
	idemmigrate.MySQL: {"idem_inbox", "idem_migrations", "idem_inbox_settings", "idem_inbox_horizons", "idem_inbox_pruned", "idem_inbox_positions"},
}

func postgres(t *testing.T) engine {
	url := pgtest.Schema(t)
	var pools []*pgxpool.Pool
	t.Cleanup(func() {
		for _, p := range pools {
			p.Close()
		}
	})
	pool := func(maxConns int) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		if maxConns > 0 {
			cfg.MaxConns = int32(maxConns)
		}
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		pools = append(pools, p)
		return p
	}
	admin := pool(2)
	return engine{
		name: idemmigrate.Postgres,
		pg:   pool,
		newM: func(t *testing.T, maxConns int, cfg *idemmigrate.Config) *idemmigrate.Migrator {
			m, err := idemmigrate.NewPgx(pool(maxConns), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
		exists: func(t *testing.T, table string) bool {
			var ok bool
			if err := admin.QueryRow(testContext(t), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			return ok
		},
		exec: func(t *testing.T, stmt string) {
			if _, err := admin.Exec(testContext(t), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		},
		versions: func(t *testing.T) map[string]int {
			return readVersions(t, func(each func(string, int)) error {
				rows, err := admin.Query(testContext(t), `SELECT table_name, version FROM idem_migrations`)
				if err != nil {
					return err
				}
				defer rows.Close()
				for rows.Next() {
					var k string
					var v int
					if err := rows.Scan(&k, &v); err != nil {
						return err
					}
					each(k, v)
				}
				return rows.Err()
			})
		},
	}
}

func readVersions(t *testing.T, scan func(func(string, int)) error) map[string]int {
	out := map[string]int{}
	if err := scan(func(k string, v int) { out[k] = v }); err != nil {
		t.Fatal(err)
	}
	return out
}

// sqlEngine is an engine reached through database/sql.
func sqlEngine(t *testing.T, name idemmigrate.Engine, open func() *sql.DB, existsSQL string) engine {
	var dbs []*sql.DB
	t.Cleanup(func() {
		for _, db := range dbs {
			_ = db.Close()
		}
	})
	pool := func(maxConns int) *sql.DB {
		db := open()
		if maxConns > 0 {
			db.SetMaxOpenConns(maxConns)
		}
		dbs = append(dbs, db)
		return db
	}
	admin := pool(0)
	return engine{
		name: name,
		newM: func(t *testing.T, maxConns int, cfg *idemmigrate.Config) *idemmigrate.Migrator {
			m, err := idemmigrate.NewSQL(pool(maxConns), name, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
		exists: func(t *testing.T, table string) bool {
			var n int
			if err := admin.QueryRowContext(testContext(t), existsSQL, table).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		},
		exec: func(t *testing.T, stmt string) {
			if _, err := admin.ExecContext(testContext(t), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		},
		versions: func(t *testing.T) map[string]int {
			return readVersions(t, func(each func(string, int)) error {
				rows, err := admin.QueryContext(testContext(t), `SELECT table_name, version FROM idem_migrations`)
				if err != nil {
					return err
				}
				defer rows.Close()
				for rows.Next() {
					var k string
					var v int
					if err := rows.Scan(&k, &v); err != nil {
						return err
					}
					each(k, v)
				}
				return rows.Err()
			})
		},
	}
}

func sqliteEngine(t *testing.T) engine {
	path := filepath.Join(t.TempDir(), "idem.db")
	return sqlEngine(t, idemmigrate.SQLite, func() *sql.DB {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(60000)")
		if err != nil {
			t.Fatal(err)
		}
		return db
	}, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`)
}

func mysqlEngine(t *testing.T) engine {
	cfg := mysqltest.Database(t, "idemmigrate_")
	return sqlEngine(t, idemmigrate.MySQL, func() *sql.DB {
		db, err := mysqlinbox.Open(cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		return db
	}, `SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`)
}

func engines() map[string]func(*testing.T) engine {
	return map[string]func(*testing.T) engine{"postgres": postgres, "mariadb": mysqlEngine, "sqlite": sqliteEngine}
}

// wantVersions checks that the version table holds one row per component,
// at the newest version Migrate reported.
func wantVersions(t *testing.T, e engine, rs []idemmigrate.Result) {
	t.Helper()
	got := e.versions(t)
	if len(got) != len(rs) {
		t.Fatalf("version table has %d rows %v, want one per component (%d)", len(got), got, len(rs))
	}
	for _, r := range rs {
		key := `"` + r.Table + `"`
		if r.Component == idemmigrate.DeadLetters {
			key = `"` + dlq.RetiredTable + `"`
		}
		if v, ok := got[key]; !ok || v != r.To || r.To == 0 {
			t.Errorf("%s: version row %s = %d (present %v), want %d", r.Component, key, v, ok, r.To)
		}
	}
}

// TestMigrateFresh: a new database migrated by the one migrator has every
// table of every component its engine stores, and one version row per
// component; a second run changes nothing.
func TestMigrateFresh(t *testing.T) {
	for name, open := range engines() {
		t.Run(name, func(t *testing.T) {
			e := open(t)
			ctx := testContext(t)
			rs, err := e.newM(t, 0, nil).Migrate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != len(idemmigrate.Supported(e.name)) {
				t.Fatalf("migrated %d components, want %v", len(rs), idemmigrate.Supported(e.name))
			}
			for _, r := range rs {
				if r.From != 0 || r.To == 0 || r.Adopted {
					t.Errorf("%s: from %d to %d (adopted %v), want from 0 to the newest", r.Component, r.From, r.To, r.Adopted)
				}
			}
			for _, tab := range tables[e.name] {
				if !e.exists(t, tab) {
					t.Errorf("table %s missing after Migrate", tab)
				}
			}
			wantVersions(t, e, rs)
			again, err := e.newM(t, 0, nil).Migrate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range again {
				if r.From != r.To {
					t.Errorf("second run: %s from %d to %d, want nothing to do", r.Component, r.From, r.To)
				}
			}
			vs, err := e.newM(t, 0, nil).GetVersion(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range vs {
				if v.From != v.To {
					t.Errorf("GetVersion: %s at %d, newest %d", v.Component, v.From, v.To)
				}
			}
		})
	}
}

// TestMigrateConcurrent: six migrators of one new database at once queue on
// the one lock: each succeeds, exactly one of them creates each component,
// and the version table has one row per component.
func TestMigrateConcurrent(t *testing.T) {
	for name, open := range engines() {
		t.Run(name, func(t *testing.T) {
			e := open(t)
			ctx := testContext(t)
			const n = 6
			ms := make([]*idemmigrate.Migrator, n)
			for i := range ms {
				ms[i] = e.newM(t, 1, nil)
			}
			var wg sync.WaitGroup
			results := make([][]idemmigrate.Result, n)
			errs := make([]error, n)
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					results[i], errs[i] = ms[i].Migrate(ctx)
				})
			}
			close(start)
			wg.Wait()
			created := map[string]int{}
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("migrator %d: %v", i, errs[i])
				}
				for _, r := range results[i] {
					if r.From < r.To {
						created[r.Component]++
					}
				}
			}
			for _, c := range idemmigrate.Supported(e.name) {
				if created[c] != 1 {
					t.Errorf("%s applied by %d migrators, want exactly 1", c, created[c])
				}
			}
			wantVersions(t, e, results[0])
		})
	}
}

// TestMigratePoolOfOne: the migration runs on the one connection it holds:
// a pool of one suffices (a second connection asked for would wait for
// the first until the deadline).
func TestMigratePoolOfOne(t *testing.T) {
	for name, open := range engines() {
		t.Run(name, func(t *testing.T) {
			e := open(t)
			ctx, cancel := context.WithTimeout(testContext(t), 30*time.Second)
			defer cancel()
			m := e.newM(t, 1, nil)
			for range 2 {
				if _, err := m.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := m.GetVersion(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMigrateAdoptsOldWay: a PostgreSQL database whose tables were created
// the ways idem created them before the one version table (the inbox's own
// migrator, the outbox's <table>_meta row, an idempotency-keys table with
// no record, the audit tables dlq creates on first use) is adopted: every
// component is taken at the version it recorded, and nothing is run again
// — an index dropped since is not recreated.
func TestMigrateAdoptsOldWay(t *testing.T) {
	e := postgres(t)
	ctx := testContext(t)
	// The old ways, through each component's own code.
	pool := e.pg(2)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Table: "idem_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.NewPgx(pool, &outbox.Config{Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	keys, err := idemkey.NewPGStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ddl := range []func(string) (string, error){dlq.AuditDDL, dlq.ActionsDDL} {
		s, err := ddl("idem_inbox")
		if err != nil {
			t.Fatal(err)
		}
		e.exec(t, s)
	}
	// Before the one version table, only the inbox recorded its version
	// there: the outbox kept it in its _meta row, idemkey nowhere.
	e.exec(t, `DELETE FROM idem_migrations WHERE table_name IN ('"idem_outbox"', '"idem_idempotency_keys"')`)
	// Dropped indexes show whether a migration runs again.
	e.exec(t, `DROP INDEX idem_outbox_unsent_idx`)
	e.exec(t, `DROP INDEX idem_idempotency_keys_expires_at_idx`)
	e.exec(t, `DROP INDEX idem_inbox_keep_until_idx`)

	rs, err := e.newM(t, 0, nil).Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{idemmigrate.Outbox: true, idemmigrate.IdempotencyKeys: true, idemmigrate.DeadLetters: true}
	for _, r := range rs {
		if r.From != r.To || r.To == 0 {
			t.Errorf("%s: from %d to %d: a migration ran again", r.Component, r.From, r.To)
		}
		if r.Adopted != want[r.Component] {
			t.Errorf("%s: adopted %v, want %v", r.Component, r.Adopted, want[r.Component])
		}
	}
	for _, idx := range []string{"idem_outbox_unsent_idx", "idem_idempotency_keys_expires_at_idx", "idem_inbox_keep_until_idx"} {
		if e.exists(t, idx) {
			t.Errorf("index %s was created again: a migration ran again", idx)
		}
	}
	wantVersions(t, e, rs)
	var shards int
	if err := pool.QueryRow(ctx, `SELECT shards FROM idem_outbox_meta`).Scan(&shards); err != nil || shards != 3 {
		t.Errorf("outbox shard count %d (%v), want the stored 3", shards, err)
	}
	// The feature's own Migrate keeps working on the adopted database.
	if r, err := ob.Migrate(ctx); err != nil || r.From != r.To {
		t.Errorf("outbox Migrate after adoption: %+v, %v", r, err)
	}
	if err := keys.Migrate(ctx); err != nil {
		t.Error(err)
	}
}

// TestScriptApplies: the exported script of every engine applies cleanly
// to an empty database, and leaves it where Migrate has nothing to do; its
// down script removes what it created.
func TestScriptApplies(t *testing.T) {
	for name, open := range engines() {
		t.Run(name, func(t *testing.T) {
			e := open(t)
			s, err := idemmigrate.NewScript(e.name, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range s.Up {
				e.exec(t, b.SQL)
			}
			rs, err := e.newM(t, 0, nil).Migrate(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				if r.From != r.To || r.Adopted {
					t.Errorf("%s after the script: from %d to %d (adopted %v), want nothing to do", r.Component, r.From, r.To, r.Adopted)
				}
			}
			wantVersions(t, e, rs)
			for _, b := range s.Down {
				e.exec(t, b.SQL)
			}
			for _, tab := range tables[e.name] {
				if tab == "idem_migrations" || strings.HasPrefix(tab, "idem_inbox_") && e.name != idemmigrate.Postgres {
					continue // SQLite and MySQL keep the shared bookkeeping tables
				}
				if e.exists(t, tab) {
					t.Errorf("table %s left by the down script", tab)
				}
			}
		})
	}
}

// TestConfigRefused: components an engine does not store, and unknown
// ones, are refused before a database is touched.
func TestConfigRefused(t *testing.T) {
	for _, c := range []struct {
		e    idemmigrate.Engine
		only string
	}{{idemmigrate.SQLite, idemmigrate.IdempotencyKeys}, {idemmigrate.MySQL, idemmigrate.Outbox}, {idemmigrate.Postgres, "queue"}} {
		if _, err := idemmigrate.NewScript(c.e, &idemmigrate.Config{Only: []string{c.only}}); err == nil {
			t.Errorf("%s --only %s: no error", c.e, c.only)
		}
	}
	if _, err := idemmigrate.NewScript(idemmigrate.Postgres, &idemmigrate.Config{InboxLayout: idemstore.LayoutPartitioned, Only: []string{"inbox"}}); err != nil {
		t.Errorf("partitioned inbox: %v", err)
	}
}
