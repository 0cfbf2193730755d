package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
)

// TestSameSchemaAsPgxinbox: on PostgreSQL both stores must build the same
// table and share the migration bookkeeping, so a user can switch from one
// to the other without a migration of their own.
func TestSameSchemaAsPgxinbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	pool := pgtest.Pool(t)
	pstore, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pstore.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var pgxSchema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&pgxSchema); err != nil {
		t.Fatal(err)
	}

	db := openPostgres(t)
	migrated(t, db, sqlinbox.Postgres, nil)
	var sqlSchema string
	if err := db.QueryRow("SELECT current_schema()").Scan(&sqlSchema); err != nil {
		t.Fatal(err)
	}

	for _, table := range []string{"idem_inbox", "idem_migrations", "idem_inbox_settings", "idem_inbox_horizons"} {
		a, b := describe(t, db, pgxSchema, table), describe(t, db, sqlSchema, table)
		t.Logf("%s: %v", table, a)
		if !slices.Equal(a, b) {
			t.Errorf("%s differs:\npgxinbox: %v\nsqlinbox: %v", table, a, b)
		}
	}

	// sqlinbox on pgxinbox's table: its migration is already recorded, and
	// claims work.
	pdb, err := sql.Open("pgx", pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	s := migrated(t, pdb, sqlinbox.Postgres, nil)
	claimOne(t, s, "billing", "k1")
	if n := countRows(t, pdb, "idem_migrations"); n != 1 {
		t.Fatalf("%d bookkeeping rows after both stores migrated, want 1", n)
	}
}

// describe lists a table's columns and indexes with the schema name removed.
func describe(t *testing.T, db *sql.DB, schema, table string) []string {
	t.Helper()
	var out []string
	rows, err := db.Query(`SELECT column_name, data_type, is_nullable, coalesce(column_default, '')
FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position`, schema, table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, typ, null, def string
		if err := rows.Scan(&name, &typ, &null, &def); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %s null=%s default=%s", name, typ, null, def))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = db.Query(`SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 ORDER BY indexname`, schema, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var def string
		if err := rows.Scan(&def); err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.ReplaceAll(def, schema+".", ""))
	}
	if len(out) == 0 {
		t.Fatalf("table %s.%s not found", schema, table)
	}
	return out
}

// labelRecorder records the table label of every retention metric.
type labelRecorder struct {
	mu     sync.Mutex
	labels []string
}

func (r *labelRecorder) add(l string) { r.mu.Lock(); r.labels = append(r.labels, l); r.mu.Unlock() }

func (r *labelRecorder) OnPrune(table string, _ int64)          { r.add("pruned " + table) }
func (r *labelRecorder) OnDrop(table string, _ int)             { r.add("dropped " + table) }
func (r *labelRecorder) OnOldest(table string, _ time.Duration) { r.add("oldest " + table) }

// TestSameMetricLabels: both stores label retention metrics with the table
// name as written (pgxinbox used to label it quoted, "\"idem_inbox\"", so
// one table had two series), on every dialect.
func TestSameMetricLabels(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	collect := func(prune func() error, stats func() error) {
		t.Helper()
		if err := prune(); err != nil {
			t.Fatal(err)
		}
		if err := stats(); err != nil {
			t.Fatal(err)
		}
	}
	var got [][]string
	// pgxinbox
	{
		rec := &labelRecorder{}
		pool := pgtest.Pool(t)
		s, err := pgxinbox.New(pool, &pgxinbox.Config{Hooks: []idem.Hook{rec}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('ledger', 'k', 'k', '\x00')`); err != nil {
			t.Fatal(err)
		}
		collect(func() error { _, err := s.Prune(ctx, retention.Options{}); return err }, func() error { _, err := s.Stats(ctx); return err })
		got = append(got, rec.labels)
	}
	for _, b := range backends {
		rec := &labelRecorder{}
		db := b.open(t)
		s := migrated(t, db, b.dialect, &sqlinbox.Config{Hooks: []idem.Hook{rec}})
		claimOne(t, s, "ledger", "k")
		collect(func() error { _, err := s.Prune(ctx, retention.Options{}); return err }, func() error { _, err := s.Stats(ctx); return err })
		got = append(got, rec.labels)
	}
	want := []string{"pruned idem_inbox", "oldest idem_inbox"}
	for i, g := range got {
		if !slices.Equal(g, want) {
			t.Errorf("store %d labelled %q, want %q", i, g, want)
		}
	}
}

// TestLongTableNameIndexes: a 63-byte table name leaves no room for an index
// suffix, and PostgreSQL cuts longer names silently, to the table's own
// name, which CREATE INDEX IF NOT EXISTS then skipped: pgxinbox created no
// processed_at index and the prune scanned the table. On both stores and
// dialects the table now gets its keep_until index (the one the prune
// uses), and two long names sharing a prefix get distinct ones.
func TestLongTableNameIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	names := []string{strings.Repeat("x", 63), strings.Repeat("x", 62) + "y"}
	// indexes counts t's indexes whose definition ends with each column.
	type counter func(table, column string) int
	check := func(store string, count counter) {
		t.Helper()
		for _, n := range names {
			if c := count(n, "keep_until"); c != 1 {
				t.Errorf("%s: table %s… has %d indexes on keep_until, want 1", store, n[:8], c)
			}
			if c := count(n, "processed_at"); c != 0 {
				t.Errorf("%s: table %s… has %d indexes on processed_at, want none (the prune goes by keep_until)", store, n[:8], c)
			}
		}
	}
	pool := pgtest.Pool(t)
	for _, n := range names {
		s, err := pgxinbox.New(pool, &pgxinbox.Config{Table: n})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	check("pgxinbox", func(table, col string) (c int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1 OFFSET 0) i WHERE indexdef LIKE '%(' || $2 || ')'`, table, col).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	})
	for _, b := range backends {
		db := b.open(t)
		for _, n := range names {
			s := migrated(t, db, b.dialect, &sqlinbox.Config{Table: n})
			claimOne(t, s, "billing", "k1")
		}
		q := `SELECT count(*) FROM (SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1 OFFSET 0) i WHERE indexdef LIKE '%(' || $2 || ')'`
		if b.dialect == sqlinbox.SQLite {
			q = `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1 AND sql LIKE '%(' || ?2 || ')'`
		}
		check("sqlinbox "+b.name, func(table, col string) (c int) {
			if err := db.QueryRowContext(ctx, q, table, col).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		})
	}
}
