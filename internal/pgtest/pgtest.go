// Package pgtest gives each test its own PostgreSQL schema on the server named
// by IDEM_DATABASE_URL, so packages and tests run in parallel without seeing
// each other's tables.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := BaseURL()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("PostgreSQL at %s is not reachable (%v); %s", base, err, FixHint)
	}
	defer conn.Close(ctx)
	name := strings.ToLower(t.Name())
	name = strings.Trim(unsafeChars.ReplaceAllString(name, "_"), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + name + "_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("creating schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("dropping schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("dropping schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parsing %s: %v", base, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
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
