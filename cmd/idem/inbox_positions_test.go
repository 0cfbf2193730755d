package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// TestInboxPositions: positions show lists a consumer's recorded
// positions, forget deletes them (and only them), on PostgreSQL and SQLite.
func TestInboxPositions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := seedInbox(t, pgxinbox.Plain)
	pg, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := sqliteinbox.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lite, err := sqlinbox.New(db, sqlinbox.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lite.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pgRecord := func(c string, ps []idemstore.Position) error {
		tx, err := pg.Begin(ctx)
		if err != nil {
			return err
		}
		if err := pg.RecordPositions(ctx, tx, c, ps); err != nil {
			return err
		}
		return pg.Commit(ctx, tx)
	}
	liteRecord := func(c string, ps []idemstore.Position) error {
		tx, err := lite.Begin(ctx)
		if err != nil {
			return err
		}
		if err := lite.RecordPositions(ctx, tx, c, ps); err != nil {
			return err
		}
		return lite.Commit(ctx, tx)
	}
	for _, tc := range []struct {
		name   string
		target []string
		record func(string, []idemstore.Position) error
	}{
		{"postgres", []string{"--database", url}, pgRecord},
		{"sqlite", []string{"--sqlite", path}, liteRecord},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := func(a ...string) []string { return append(a, tc.target...) }
			if err := tc.record("billing", []idemstore.Position{{Source: "invoices/0", Next: 42}, {Source: "invoices/1", Next: 7}}); err != nil {
				t.Fatal(err)
			}
			if err := tc.record("other", []idemstore.Position{{Source: "invoices/0", Next: 3}}); err != nil {
				t.Fatal(err)
			}
			out := inboxRun(t, 0, args("positions", "show", "--consumer", "billing")...)
			if !strings.Contains(out, "invoices/0") || !strings.Contains(out, "42") || !strings.Contains(out, "invoices/1") {
				t.Fatalf("positions show: %q", out)
			}
			if out := inboxRun(t, 0, args("positions", "forget", "--consumer", "billing")...); !strings.Contains(out, "forgot 2 positions of billing") {
				t.Fatalf("positions forget: %q", out)
			}
			if out := inboxRun(t, 0, args("positions", "show", "--consumer", "billing")...); !strings.Contains(out, "no positions recorded for billing") {
				t.Fatalf("positions show after forget: %q", out)
			}
			if out := inboxRun(t, 0, args("positions", "show", "--consumer", "other")...); !strings.Contains(out, "invoices/0") {
				t.Fatalf("another consumer's positions were forgotten too: %q", out)
			}
			inboxRun(t, 2, args("positions", "show")...)
		})
	}
}
