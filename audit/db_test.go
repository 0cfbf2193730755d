package audit_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
)

// testDatabase is where these tests make their schemas, rather than the
// shared test database: CREATE INDEX CONCURRENTLY waits for every older
// transaction in its database, and other packages' tests keep that one
// busy (a guard took 90 s there under a parallel make test).
const testDatabase = "idem_audit_test"

// schemaURL creates a fresh schema in testDatabase (creating the database
// when missing), drops it when t ends, and returns a URL whose search_path
// is that schema. It is pgtest.Schema on another database; cmd/idem's
// audit tests carry the same helper.
func schemaURL(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base, err := url.Parse(pgtest.BaseURL())
	if err != nil {
		t.Fatalf("parsing the database URL: %v", err)
	}
	admin, err := pgx.Connect(ctx, base.String())
	if err != nil {
		t.Fatalf("PostgreSQL at %s is not reachable (%v); %s", base.Redacted(), err, pgtest.FixHint)
	}
	defer admin.Close(ctx)
	for attempt := 0; ; attempt++ {
		var exists bool
		if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", testDatabase).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists {
			break
		}
		_, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{testDatabase}.Sanitize())
		var pe *pgconn.PgError
		// 42P04 or 23505: a concurrent test created it first; 55006: the
		// template is busy with a concurrent CREATE DATABASE.
		if err == nil || errors.As(err, &pe) && (pe.Code == "42P04" || pe.Code == "23505") {
			break
		}
		if !errors.As(err, &pe) || pe.Code != "55006" || attempt > 50 {
			t.Fatalf("creating database %s: %v", testDatabase, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	db := *base
	db.Path = "/" + testDatabase
	name := strings.ToLower(t.Name())
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name) + "_" + hex.EncodeToString(b[:])
	exec := func(ctx context.Context, sql string) error {
		c, err := pgx.Connect(ctx, db.String())
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("creating schema %s in %s: %v", schema, testDatabase, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("dropping schema %s: %v", schema, err)
		}
	})
	q := db.Query()
	q.Set("search_path", schema)
	db.RawQuery = q.Encode()
	return db.String()
}

// testPool is a pool on a fresh schema, closed when t ends.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), schemaURL(t))
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
