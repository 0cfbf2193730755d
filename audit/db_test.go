package audit_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
)

// testDatabase is where these tests make their schemas, rather than the
// shared test database: CREATE INDEX CONCURRENTLY waits for every older
// transaction in its database, and other packages' tests keep that one
// busy (a guard took 90 s there under a parallel make test).
const testDatabase = "idem_audit_test"

// schemaURL makes a fresh schema in testDatabase (see pgtest.SchemaIn).
func schemaURL(t testing.TB) string {
	t.Helper()
	return pgtest.SchemaIn(t, testDatabase)
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
