// Package pgtest gives each test its own PostgreSQL schema on the server named
// by IDEM_DATABASE_URL, so packages and tests run in parallel without seeing
// each other's tables.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pooltest"
)

// DefaultURL is used when IDEM_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// FixHint is the command that brings the test database up.
const FixHint = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start (or run make test), or set IDEM_DATABASE_URL"

// BaseURL returns IDEM_DATABASE_URL or DefaultURL.
func BaseURL() string {
	if u := os.Getenv("IDEM_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9_]+`)

// Schema creates a fresh schema for t, drops it when t ends, and returns a
// connection URL whose search_path is that schema, so unqualified table names
// land in it. The test fails with the command that fixes a missing server.
func Schema(t testing.TB) string {
	t.Helper()
	return SchemaIn(t, "")
}

// SchemaIn is Schema in another database of the same server, created when
// missing (database "" means the one of BaseURL). Tests that build indexes
// CONCURRENTLY use their own database: such a build waits for every older
// transaction in its database, and other packages' tests keep the shared
// one busy.
func SchemaIn(t testing.TB, database string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := url.Parse(BaseURL())
	if err != nil {
		t.Fatalf("parsing %s: %v", BaseURL(), err)
	}
	admin, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("PostgreSQL at %s is not reachable (%v); %s", u.Redacted(), err, FixHint)
	}
	defer admin.Close(ctx)
	if database != "" {
		if err := createDatabase(ctx, admin, database); err != nil {
			t.Fatalf("creating database %s: %v", database, err)
		}
		u.Path = "/" + database
	}
	name := strings.ToLower(t.Name())
	name = strings.Trim(unsafeChars.ReplaceAllString(name, "_"), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := pgx.Identifier{"t_" + name + "_" + hex.EncodeToString(b[:])}.Sanitize()
	exec := func(ctx context.Context, sql string) error {
		c, err := pgx.Connect(ctx, u.String())
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("creating schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("dropping schema %s: %v", schema, err)
		}
	})
	q := u.Query()
	q.Set("search_path", strings.Trim(schema, `"`))
	u.RawQuery = q.Encode()
	return u.String()
}

// createDatabase creates database unless it exists, tolerating a
// concurrent test doing the same.
func createDatabase(ctx context.Context, admin *pgx.Conn, database string) error {
	for attempt := 0; ; attempt++ {
		var exists bool
		if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", database).Scan(&exists); err != nil || exists {
			return err
		}
		_, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{database}.Sanitize())
		var pe *pgconn.PgError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &pe) && (pe.Code == "42P04" || pe.Code == "23505"):
			return nil // a concurrent test created it first
		case errors.As(err, &pe) && pe.Code == "55006" && attempt < 50:
			// The template is busy with a concurrent CREATE DATABASE.
			time.Sleep(100 * time.Millisecond)
		default:
			return err
		}
	}
}

// Pool returns a pool on a fresh schema for t, closed when t ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), Schema(t))
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PoolOf is Pool with at most conns connections (0: pgx's default size),
// watched by internal/pooltest for an operation that waits for itself.
func PoolOf(t testing.TB, conns int) *pgxpool.Pool {
	t.Helper()
	return pooltest.OpenPgx(t, Schema(t), conns)
}

// PoolBehindFaultOf is PoolBehindFault with at most conns connections, as
// PoolOf.
func PoolBehindFaultOf(t testing.TB, conns int) (*pgxpool.Pool, *netfault.Proxy) {
	t.Helper()
	u, p := SchemaBehindFault(t)
	return pooltest.OpenPgx(t, u, conns), p
}

// PoolBehindFault is Pool with every connection through a netfault proxy
// and a one-second connect timeout, for tests of real outages: Stop or
// Freeze the proxy and the pool meets what a database host that went away
// gives.
func PoolBehindFault(t testing.TB) (*pgxpool.Pool, *netfault.Proxy) {
	t.Helper()
	u, p := SchemaBehindFault(t)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// SchemaBehindFault is Schema reached through a netfault proxy, with a
// one-second connect timeout.
func SchemaBehindFault(t testing.TB) (string, *netfault.Proxy) {
	t.Helper()
	base := Schema(t)
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		t.Fatalf("parsing %s: %v", base, err)
	}
	p := netfault.New(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	u, err := url.Parse(p.URL(t, base))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	return u.String(), p
}
