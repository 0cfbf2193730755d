package sqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

func TestMigrateTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := b.open(t)
			s := migrated(t, db, b.dialect, nil)
			claimOne(t, s, "billing", "k1")
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("second migrate: %v", err)
			}
			if n := countRows(t, db, "idem_inbox"); n != 1 {
				t.Fatalf("second migrate changed the inbox: %d rows, want 1", n)
			}
			var v int
			if err := db.QueryRow(`SELECT version FROM idem_migrations WHERE table_name = '"idem_inbox"'`).Scan(&v); err != nil || v != 2 {
				t.Fatalf("recorded version %d (%v), want 2", v, err)
			}
			if n := countRows(t, db, "idem_migrations"); n != 1 {
				t.Fatalf("%d bookkeeping rows, want 1", n)
			}
		})
	}
}

// TestConcurrentMigrators: processes starting together must not trip over
// each other creating the tables.
func TestConcurrentMigrators(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for i := range 8 {
				wg.Go(func() {
					s, err := sqlinbox.New(db, b.dialect, &sqlinbox.Config{Table: fmt.Sprintf("inbox_%d", i%2)})
					if err == nil {
						err = s.Migrate(context.Background())
					}
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("concurrent migrate: %v", err)
				}
			}
			if n := countRows(t, db, "idem_migrations"); n != 2 {
				t.Fatalf("%d bookkeeping rows, want 2", n)
			}
		})
	}
}

func TestSchemaQualifiedTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openPostgres(t)
	var cur string
	if err := db.QueryRow("SELECT current_schema()").Scan(&cur); err != nil {
		t.Fatal(err)
	}
	other := cur + "_q"
	if _, err := db.Exec(`CREATE SCHEMA "` + other + `"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA "` + other + `" CASCADE`) })
	s := migrated(t, db, sqlinbox.Postgres, &sqlinbox.Config{Table: other + ".Billing_Inbox"})
	if s.Table() != other+".Billing_Inbox" {
		t.Fatalf("Table() = %q", s.Table())
	}
	claimOne(t, s, "billing", "k1")
	// The table, its index and the bookkeeping live in the named schema,
	// with the case kept, and nothing in the search_path schema.
	var tables, indexes int
	if err := db.QueryRow(`SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename IN ('Billing_Inbox', 'idem_migrations')`, other).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'Billing_Inbox_keep_until_idx'`, other).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if tables != 2 || indexes != 1 {
		t.Fatalf("in schema %s: %d tables (want 2), %d keep_until indexes (want 1)", other, tables, indexes)
	}
	if n := countRows(t, db, `"`+other+`"."Billing_Inbox"`); n != 1 {
		t.Fatalf("%d markers in the qualified table, want 1", n)
	}
	var here int
	if err := db.QueryRow(`SELECT count(*) FROM pg_tables WHERE schemaname = $1`, cur).Scan(&here); err != nil || here != 0 {
		t.Fatalf("%d tables leaked into the search_path schema (%v)", here, err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
}

func TestTableNames(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", "postgres://unused") // New never touches the database
	if err != nil {
		t.Fatal(err)
	}
	hostile := []string{
		`idem_inbox; DROP TABLE invoices`,
		`idem_inbox"; DROP TABLE invoices; --`,
		`a.b.c`,
		`.inbox`,
		`inbox.`,
		`1inbox`,
		`in box`,
		`inbox-2`,
		`hộp_thư`,
		strings.Repeat("a", 64),
	}
	for _, name := range hostile {
		for _, d := range []sqlinbox.Dialect{sqlinbox.Postgres, sqlinbox.SQLite} {
			if _, err := sqlinbox.New(db, d, &sqlinbox.Config{Table: name}); !errors.Is(err, idem.ErrConfig) {
				t.Errorf("%s: table name %q: %v, want an idem.ErrConfig", d.Name(), name, err)
			}
		}
	}
	if _, err := sqlinbox.New(db, sqlinbox.SQLite, &sqlinbox.Config{Table: "main.inbox"}); err == nil {
		t.Errorf("sqlite accepted a schema-qualified name")
	}
	for _, name := range []string{"", "inbox", "_Inbox2", strings.Repeat("a", 63), "billing.inbox"} {
		s, err := sqlinbox.New(db, sqlinbox.Postgres, &sqlinbox.Config{Table: name})
		if err != nil {
			t.Errorf("refused table name %q: %v", name, err)
			continue
		}
		if name == "" && s.Table() != sqlinbox.DefaultTable {
			t.Errorf("default table %q, want %q", s.Table(), sqlinbox.DefaultTable)
		}
	}
	if _, err := sqlinbox.New(db, nil, nil); err == nil {
		t.Errorf("nil dialect accepted")
	}
	if _, err := sqlinbox.New(nil, sqlinbox.SQLite, nil); err == nil {
		t.Errorf("nil db accepted")
	}
}

// TestLongTableName: a 63-byte name leaves no room for the index suffix; the
// index name is shortened rather than silently truncated by the server.
func TestLongTableName(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := migrated(t, db, b.dialect, &sqlinbox.Config{Table: strings.Repeat("x", 63)})
			claimOne(t, s, "billing", "k1")
		})
	}
}

func TestClaim(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := b.open(t)
			s := migrated(t, db, b.dialect, nil)
			event := time.Date(2024, 5, 1, 23, 59, 30, 123456000, time.FixedZone("ICT", 7*3600))
			first := claims("a", "b")
			first[0].EventTime = event
			if got := claimCommit(t, s, "billing", first); fmt.Sprint(got) != "[true true]" {
				t.Fatalf("first claim: %v", got)
			}
			// Keys already present come back false, new ones true, in the
			// order given; a key repeated in one claim is inserted once.
			got := claimCommit(t, s, "billing", claims("a", "c", "b", "d", "d"))
			if fmt.Sprint(got) != "[false true false true false]" {
				t.Fatalf("second claim: %v, want [false true false true false]", got)
			}
			// Another consumer has its own keys.
			if got := claimCommit(t, s, "ledger", claims("a")); !got[0] {
				t.Fatalf("same key, other consumer: not inserted")
			}
			if n := countRows(t, db, "idem_inbox"); n != 5 {
				t.Fatalf("%d markers, want 5", n)
			}

			tx, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Rollback(ctx, tx) }()
			ms, err := s.Lookup(ctx, tx, "billing", []string{"a", "d", "missing"})
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != 2 {
				t.Fatalf("lookup found %d markers, want 2: %v", len(ms), ms)
			}
			a := ms["a"]
			if a.MessageID != "msg-a" || string(a.BodySHA256) != string(idem.BodyHash([]byte("a"))) {
				t.Fatalf("marker a = %+v", a)
			}
			if age := time.Since(a.ProcessedAt); age < -time.Minute || age > time.Minute {
				t.Fatalf("marker a processed at %v, not now", a.ProcessedAt)
			}
			var et time.Time
			if b.dialect == sqlinbox.SQLite {
				var text string
				if err := tx.QueryRow(`SELECT event_time FROM idem_inbox WHERE key = 'a'`).Scan(&text); err != nil {
					t.Fatal(err)
				}
				if text != "2024-05-01T16:59:30.123456Z" {
					t.Fatalf("SQLite event_time stored as %q, want fixed-width UTC", text)
				}
				et, _ = time.Parse("2006-01-02T15:04:05.000000Z", text)
			} else if err := tx.QueryRow(`SELECT event_time FROM idem_inbox WHERE key = 'a'`).Scan(&et); err != nil {
				t.Fatal(err)
			}
			if !et.Equal(event) {
				t.Fatalf("event_time %v, want %v", et, event)
			}
			var nulls int
			if err := tx.QueryRow(`SELECT count(*) FROM idem_inbox WHERE event_time IS NULL`).Scan(&nulls); err != nil || nulls != 4 {
				t.Fatalf("%d markers without event time (%v), want 4: a zero time is NULL", nulls, err)
			}
		})
	}
}

// TestSQLiteTimesAreFixedWidth: processed_at must sort as text, so the
// database default writes the same width as Go does.
func TestSQLiteTimesAreFixedWidth(t *testing.T) {
	t.Parallel()
	db := openSQLite(t)
	s := migrated(t, db, sqlinbox.SQLite, nil)
	claimOne(t, s, "billing", "k1")
	var at string
	if err := db.QueryRow(`SELECT processed_at FROM idem_inbox`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`).MatchString(at) {
		t.Fatalf("processed_at stored as %q, want 2006-01-02T15:04:05.000000Z", at)
	}
}

// TestClaimChunks: a batch with more parameters than one statement may carry
// is split, and every result still lines up with its claim.
func TestClaimChunks(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := migrated(t, db, b.dialect, nil)
			// Just over one statement's worth: 65535/5 rows on PostgreSQL,
			// 32766/5 on SQLite (kept small there: the race detector makes
			// the pure-Go SQLite slow).
			n := 13200
			if b.dialect == sqlinbox.SQLite {
				n = 6600
			}
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%05d", i)
			}
			claimCommit(t, s, "billing", claims(keys[n/2:]...))
			got := claimCommit(t, s, "billing", claims(keys...))
			for i, ok := range got {
				if ok != (i < n/2) {
					t.Fatalf("claim %d (%s): inserted=%v", i, keys[i], ok)
				}
			}
			if c := countRows(t, db, "idem_inbox"); c != n {
				t.Fatalf("%d markers, want %d", c, n)
			}
			tx, err := s.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Rollback(context.Background(), tx) }()
			ms, err := s.Lookup(context.Background(), tx, "billing", keys)
			if err != nil || len(ms) != n {
				t.Fatalf("lookup of %d keys found %d (%v)", n, len(ms), err)
			}
		})
	}
}

func TestClassifyPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openPostgres(t)
	s := migrated(t, db, sqlinbox.Postgres, nil)
	claimOne(t, s, "billing", "held")
	cases := []struct {
		name string
		sql  string
		want idemstore.ErrorClass
	}{
		{"unique violation 23505", `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('billing', 'held', 'm', '')`, idemstore.ClassPermanent},
		{"not null 23502", `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('billing', 'x', NULL, '')`, idemstore.ClassPermanent},
		{"division by zero 22012", `SELECT 1/0`, idemstore.ClassPermanent},
		{"bad timestamp 22007", `SELECT 'yesterday-ish'::timestamptz`, idemstore.ClassPermanent},
		{"undefined table 42P01", `SELECT * FROM no_such_table`, idemstore.ClassConfig},
		{"serialization 40001", `DO $$BEGIN RAISE EXCEPTION USING ERRCODE = '40001'; END$$`, idemstore.ClassBusy},
		{"deadlock 40P01", `DO $$BEGIN RAISE EXCEPTION USING ERRCODE = '40P01'; END$$`, idemstore.ClassBusy},
	}
	for _, c := range cases {
		_, err := db.ExecContext(ctx, c.sql)
		if err == nil {
			t.Fatalf("%s: no error", c.name)
		}
		if got := s.Classify(fmt.Errorf("wrapped: %w", err)); got != c.want {
			t.Errorf("%s: %v classified %v, want %v", c.name, err, got, c.want)
		}
	}
	// A real lock timeout, 55P03: a claim behind a held key gives up.
	holder, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Rollback(ctx, holder) }()
	if _, err := s.Claim(ctx, holder, "billing", claims("busy"), time.Second); err != nil {
		t.Fatal(err)
	}
	waiter, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Rollback(ctx, waiter) }()
	start := time.Now()
	_, err = s.Claim(ctx, waiter, "billing", claims("busy"), 50*time.Millisecond)
	if err == nil {
		t.Fatal("claim behind a held key succeeded")
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("lock timeout not applied: waited %v", time.Since(start))
	}
	if got := s.Classify(err); got != idemstore.ClassBusy {
		t.Fatalf("lock timeout %v classified %v, want busy", err, got)
	}
	if got := s.Classify(errors.New("handler failed")); got != idemstore.ClassTransient {
		t.Fatalf("a non-database error classified %v, want transient", got)
	}
}

func TestClassifySQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := sqliteinbox.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := migrated(t, db, sqlinbox.SQLite, nil)
	claimOne(t, s, "billing", "held")
	_, err = db.ExecContext(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('billing', 'held', 'm', x'')`)
	if err == nil || s.Classify(err) != idemstore.ClassPermanent {
		t.Fatalf("primary key violation %v: want a permanent error", err)
	}
	// SQLITE_BUSY: a second handle that will not wait, against a writer
	// holding the lock.
	holder, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Rollback(ctx, holder) }()
	impatient, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer impatient.Close()
	tx, err := impatient.BeginTx(ctx, nil)
	if err == nil {
		_ = tx.Rollback()
		t.Fatal("second writer got the lock while the first held it")
	}
	var coded interface{ Code() int }
	if !errors.As(err, &coded) || coded.Code()&0xff != 5 {
		t.Fatalf("want SQLITE_BUSY, got %v", err)
	}
	if got := s.Classify(err); got != idemstore.ClassBusy {
		t.Fatalf("SQLITE_BUSY classified %v, want busy", got)
	}
}

func TestSQLiteOpen(t *testing.T) {
	t.Parallel()
	db := openSQLite(t)
	var mode string
	var busy, fk int
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q (%v), want wal", mode, err)
	}
	if err := db.QueryRow(`PRAGMA busy_timeout`).Scan(&busy); err != nil || busy != 5000 {
		t.Fatalf("busy_timeout %d (%v), want 5000", busy, err)
	}
	if err := db.QueryRow(`PRAGMA foreign_keys`).Scan(&fk); err != nil || fk != 1 {
		t.Fatalf("foreign_keys %d (%v), want 1", fk, err)
	}
	if _, err := sqliteinbox.Open(""); err == nil {
		t.Fatal("empty path accepted")
	}
	if _, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "no", "such", "dir", "x.db")); err == nil {
		t.Fatal("unopenable path accepted")
	}
}

// claims builds one claim per key, with the message ID "msg-<key>".
func claims(keys ...string) []idemstore.Claim {
	out := make([]idemstore.Claim, len(keys))
	for i, k := range keys {
		out[i] = idemstore.Claim{Key: k, MessageID: "msg-" + k, BodySHA256: idem.BodyHash([]byte(k))}
	}
	return out
}

// claimCommit claims in a transaction of its own and commits it.
func claimCommit(t *testing.T, s *sqlinbox.Store, consumer string, cs []idemstore.Claim) []bool {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Claim(ctx, tx, consumer, cs, time.Second)
	if err != nil {
		_ = s.Rollback(ctx, tx)
		t.Fatalf("claim: %v", err)
	}
	if len(got) != len(cs) {
		t.Fatalf("claim answered %d results for %d claims", len(got), len(cs))
	}
	if err := s.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return got
}

func claimOne(t *testing.T, s *sqlinbox.Store, consumer, key string) {
	t.Helper()
	if got := claimCommit(t, s, consumer, claims(key)); !got[0] {
		t.Fatalf("claim of new key %q not inserted", key)
	}
}

// TestLongTableNameHasIndex: the keep_until index, which the prune uses,
// exists even when the table's name leaves no room for the suffix.
func TestLongTableNameHasIndex(t *testing.T) {
	t.Parallel()
	db := openPostgres(t)
	name := strings.Repeat("x", 63)
	migrated(t, db, sqlinbox.Postgres, &sqlinbox.Config{Table: name})
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM (SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1 OFFSET 0) i WHERE indexdef LIKE '%(keep_until)'`, name).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d keep_until indexes (%v), want 1", n, err)
	}
}
