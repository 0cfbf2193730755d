package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
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

	for _, table := range []string{"idem_inbox", "idem_migrations"} {
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
