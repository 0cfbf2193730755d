package main

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// ddlTarget is an empty database of one engine: the flags naming it, and how
// to run a script's statements on it.
type ddlTarget struct {
	dialect string
	flags   []string
	apply   func(t *testing.T, script string)
}

func ddlTargets() map[string]func(t *testing.T) ddlTarget {
	return map[string]func(t *testing.T) ddlTarget{
		"postgres": func(t *testing.T) ddlTarget {
			url := pgtest.Schema(t)
			pool, err := pgxpool.New(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return ddlTarget{dialect: "postgres", flags: []string{"--database", url}, apply: func(t *testing.T, script string) {
				// One simple-protocol Exec runs the whole script, PL/pgSQL
				// blocks and all, in one implicit transaction, as psql
				// --single-transaction does.
				if _, err := pool.Exec(context.Background(), script); err != nil {
					t.Fatalf("applying the script: %v\n%s", err, script)
				}
			}}
		},
		"sqlite": func(t *testing.T) ddlTarget {
			path := filepath.Join(t.TempDir(), "idem.db")
			db, err := sqliteinbox.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return ddlTarget{dialect: "sqlite", flags: []string{"--sqlite", path}, apply: applyEach(db)}
		},
		"mariadb": func(t *testing.T) ddlTarget {
			dsn := mysqltest.Database(t, "idemddl_").FormatDSN()
			db, err := mysqlinbox.Open(dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return ddlTarget{dialect: "mysql", flags: []string{"--mysql", dsn}, apply: applyEach(db)}
		},
	}
}

// applyEach runs a script statement by statement, as goose splits one.
func applyEach(db *sql.DB) func(t *testing.T, script string) {
	return func(t *testing.T, script string) {
		for _, stmt := range gooseStatements(script) {
			if strings.TrimSpace(withoutComments(stmt)) == "" {
				continue
			}
			if _, err := db.ExecContext(context.Background(), stmt); err != nil {
				t.Fatalf("applying a statement: %v\n%s", err, stmt)
			}
		}
	}
}

func withoutComments(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// TestDDLFormatsApply: in every format, idem ddl's SQL applies cleanly to an
// empty database of each engine, and leaves it where idem migrate finds
// every component up to date; the down script removes the tables.
func TestDDLFormatsApply(t *testing.T) {
	for name, open := range ddlTargets() {
		for _, format := range ddlFormats {
			t.Run(name+"/"+format, func(t *testing.T) {
				db := open(t)
				args := []string{"ddl", "--dialect", db.dialect, "--format", format}
				var up, down string
				switch format {
				case "plain", "flyway":
					r := cli(t, args...)
					r.expect(t, 0, args)
					up = r.stdout
					dargs := []string{"ddl", "--dialect", db.dialect, "--down"}
					d := cli(t, dargs...)
					d.expect(t, 0, dargs)
					down = d.stdout
				case "goose":
					r := cli(t, args...)
					r.expect(t, 0, args)
					up, down = gooseSections(t, r.stdout)
				case "golang-migrate":
					dir := t.TempDir()
					args = append(args, "--out", dir)
					cli(t, args...).expect(t, 0, args)
					read := func(name string) string {
						b, err := os.ReadFile(filepath.Join(dir, name))
						if err != nil {
							t.Fatal(err)
						}
						return string(b)
					}
					up, down = read("000001_idem.up.sql"), read("000001_idem.down.sql")
				}
				db.apply(t, up)
				margs := append([]string{"migrate"}, db.flags...)
				r := cli(t, margs...)
				r.expect(t, 0, margs)
				if strings.Contains(r.stdout, "created") || strings.Contains(r.stdout, "migrated") || !strings.Contains(r.stdout, "up to date") {
					t.Fatalf("migrate after the %s script did something:\n%s", format, r.stdout)
				}
				db.apply(t, down)
				r = cli(t, margs...)
				r.expect(t, 0, margs)
				if strings.Contains(r.stdout, "up to date") {
					t.Fatalf("migrate after the down script found tables:\n%s", r.stdout)
				}
			})
		}
	}
}

// TestMigrateNamesItsDatabase: idem migrate says which database it touched,
// and the components it migrated there.
func TestMigrateNamesItsDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "named.db")
	args := []string{"migrate", "--sqlite", path, "--only", "outbox", "--outbox-table", "orders_outbox"}
	r := cli(t, args...)
	r.expect(t, 0, args)
	if !strings.Contains(r.stdout, "SQLite "+path) || !strings.Contains(r.stdout, "orders_outbox: created") || strings.Contains(r.stdout, "inbox ") {
		t.Fatalf("migrate printed:\n%s", r.stdout)
	}
	args = []string{"migrate", "--sqlite", path, "--only", "idemkey"}
	cli(t, args...).expect(t, 2, args)
}
