package pgxinbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

var layouts = []pgxinbox.Layout{pgxinbox.Plain, pgxinbox.Partitioned}

// pgCatalog describes the inbox table and its bookkeeping as PostgreSQL
// sees them: columns with types, defaults and collations, indexes,
// constraints, the partition key, and the bookkeeping rows. Partitions are
// left out (Migrate creates them, the DDL leaves them to the ensure).
const pgCatalog = `SELECT string_agg(x, E'\n' ORDER BY x) FROM (
    SELECT format('col %s %s %s %s notnull=%s default=%s collate=%s', c.relname, a.attnum, a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid), co.collname)
    FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    LEFT JOIN pg_collation co ON co.oid = a.attcollation
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND c.relispartition = false
      AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'index ' || replace(pg_get_indexdef(i.indexrelid), current_schema() || '.', '') FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relispartition = false
    UNION ALL
    SELECT format('constraint %s %s %s', c.relname, k.conname, pg_get_constraintdef(k.oid))
    FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relispartition = false
    UNION ALL
    SELECT format('table %s %s %s', relname, relkind, pg_get_partkeydef(oid)) FROM pg_class
    WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p') AND relispartition = false
    UNION ALL
    SELECT format('settings %s %s %s', table_name, layout, window_ms) FROM idem_inbox_settings
    UNION ALL
    SELECT format('version %s %s', table_name, version) FROM idem_migrations
) s(x)`

func catalogOf(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), pgCatalog).Scan(&s); err != nil {
		t.Fatalf("reading the catalog: %v", err)
	}
	return s
}

func newStore(t *testing.T, pool *pgxpool.Pool, layout pgxinbox.Layout) *pgxinbox.Store {
	t.Helper()
	s, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// applyDDL runs the DDL of the default table as a migration tool would:
// one Exec of the whole script.
func applyDDL(t *testing.T, pool *pgxpool.Pool, layout pgxinbox.Layout) string {
	t.Helper()
	ddl, err := pgxinbox.DDL("", layout, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), ddl); err != nil {
		t.Fatalf("applying the DDL: %v\n%s", err, ddl)
	}
	return ddl
}

// TestDDLSameAsMigrate: the DDL run by a migration tool makes the same
// table, indexes, constraints and bookkeeping as Migrate, in both layouts.
func TestDDLSameAsMigrate(t *testing.T) {
	t.Parallel()
	for _, layout := range layouts {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			viaDDL, viaMigrate := pgtest.Pool(t), pgtest.Pool(t)
			applyDDL(t, viaDDL, layout)
			if err := newStore(t, viaMigrate, layout).Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			got, want := catalogOf(t, viaDDL), catalogOf(t, viaMigrate)
			if got != want {
				t.Fatalf("the DDL's catalog differs from Migrate's:\n--- DDL\n%s\n--- Migrate\n%s", got, want)
			}
			if !strings.Contains(got, "idem_inbox_keep_until_idx") && layout == pgxinbox.Plain {
				t.Fatalf("catalog without the keep_until index:\n%s", got)
			}
		})
	}
}

// TestDDLTableIsReady: a table made by the DDL passes Check (partitioned:
// once its partitions exist, which Check asks for until then), takes claims,
// is up to date for Migrate, and survives the DDL run again with its
// markers and their keep_until untouched.
func TestDDLTableIsReady(t *testing.T) {
	t.Parallel()
	for _, layout := range layouts {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			applyDDL(t, pool, layout)
			store := newStore(t, pool, layout)
			if layout == pgxinbox.Partitioned {
				probs := check(t, store)
				if !hasProblem(probs, "no partition for today", "idem inbox partitions ensure --table idem_inbox") {
					t.Fatalf("partitioned table without partitions: problems %v, want one naming the ensure", probs)
				}
				if _, err := store.EnsurePartitions(ctx, time.Now(), 3); err != nil {
					t.Fatal(err)
				}
			}
			if probs := check(t, store); len(probs) != 0 {
				t.Fatalf("Check on the DDL's table: %v, want none", probs)
			}
			proc := consumerOf(t, store)
			if err := proc.Check(ctx); err != nil {
				t.Fatalf("Processor.Check on the DDL's table: %v", err)
			}
			msg := idem.Message{ID: idem.NewUUIDv7(time.Now()), Body: []byte("x")}
			if r := proc.Process(ctx, msg); r.Outcome != idem.Applied {
				t.Fatalf("first delivery: %v %v, want applied", r.Outcome, r.Err)
			}
			if r := proc.Process(ctx, msg); r.Outcome != idem.Duplicate {
				t.Fatalf("second delivery: %v %v, want duplicate", r.Outcome, r.Err)
			}
			rep, err := store.MigrateReport(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Created || rep.From != rep.To || rep.To == 0 || rep.Window != 14*24*time.Hour || rep.Layout != layout {
				t.Fatalf("Migrate after the DDL: %+v, want up to date with the DDL's window and layout", rep)
			}
			if !strings.Contains(rep.String(), "idem_inbox is up to date (schema version") {
				t.Fatalf("report %q", rep)
			}

			// A tool that runs the script again changes nothing.
			far := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Microsecond)
			if _, err := pool.Exec(ctx, `UPDATE idem_inbox SET keep_until = $1`, far); err != nil {
				t.Fatal(err)
			}
			before := catalogOf(t, pool)
			applyDDL(t, pool, layout)
			if after := catalogOf(t, pool); after != before {
				t.Fatalf("the DDL run again changed the catalog:\n%s\nto\n%s", before, after)
			}
			var n int
			var ku time.Time
			if err := pool.QueryRow(ctx, `SELECT count(*), max(keep_until) FROM idem_inbox`).Scan(&n, &ku); err != nil {
				t.Fatal(err)
			}
			if n != 1 || !ku.Equal(far) {
				t.Fatalf("after the DDL ran again: %d markers kept until %v, want 1 kept until %v", n, ku, far)
			}
		})
	}
}

// TestDDLRefusesNewerAndOtherLayout: the script run against a table of a
// newer schema or of the other layout fails, naming the cause, and
// changes nothing.
func TestDDLRefusesNewerAndOtherLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if err := newStore(t, pool, pgxinbox.Plain).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ddl, err := pgxinbox.DDL("", pgxinbox.Partitioned, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ddl); err == nil || !strings.Contains(err.Error(), "another layout") {
		t.Fatalf("partitioned DDL on a plain table: %v, want a refusal naming the layout", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_migrations SET version = 99`); err != nil {
		t.Fatal(err)
	}
	before := catalogOf(t, pool)
	ddl, err = pgxinbox.DDL("", pgxinbox.Plain, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ddl); err == nil || !strings.Contains(err.Error(), "newer than this script") {
		t.Fatalf("DDL on a table of a newer schema: %v, want a refusal", err)
	}
	if after := catalogOf(t, pool); after != before {
		t.Fatalf("a refused DDL changed the catalog:\n%s\nto\n%s", before, after)
	}
}

// TestDDLDownRemovesWhatUpMade: down leaves the schema as it was, and up
// runs again after it.
func TestDDLDownRemovesWhatUpMade(t *testing.T) {
	t.Parallel()
	for _, layout := range layouts {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			applyDDL(t, pool, layout)
			if layout == pgxinbox.Partitioned {
				if _, err := newStore(t, pool, layout).EnsurePartitions(ctx, time.Now(), 2); err != nil {
					t.Fatal(err)
				}
			}
			down, err := pgxinbox.DownDDL("", layout)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, down); err != nil {
				t.Fatalf("down: %v\n%s", err, down)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Fatalf("down left %d relations in the schema", n)
			}
			applyDDL(t, pool, layout)
		})
	}
}

func check(t *testing.T, s *pgxinbox.Store) []idemstore.SchemaProblem {
	t.Helper()
	probs, err := s.Check(context.Background())
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return probs
}

func hasProblem(probs []idemstore.SchemaProblem, what, fix string) bool {
	for _, p := range probs {
		if strings.Contains(p.What, what) && strings.Contains(p.Fix, fix) {
			return true
		}
	}
	return false
}

func consumerOf(t *testing.T, s *pgxinbox.Store) *idem.Processor[pgx.Tx] {
	t.Helper()
	p, err := idem.NewProcessor(s, &idem.Config[pgx.Tx]{
		Consumer: "billing",
		Key:      idem.ByMessageID,
		Handler:  func(context.Context, pgx.Tx, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckFindsBrokenTables: each way an inbox table breaks in the field
// is one problem with its fix, and a consumer refuses to start on it with
// that problem and fix.
func TestCheckFindsBrokenTables(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		layout pgxinbox.Layout // the store's
		made   pgxinbox.Layout // the table's
		breakf string          // SQL that breaks a migrated table
		what   string
		fix    string
		// advisory: a consumer starts on the table, logging the problem.
		advisory bool
	}{
		{"missing table", pgxinbox.Plain, pgxinbox.Plain, `DROP TABLE idem_inbox`,
			"table idem_inbox does not exist", "idem inbox migrate --table idem_inbox", false},
		{"dropped keep_until index", pgxinbox.Plain, pgxinbox.Plain, `DROP INDEX idem_inbox_keep_until_idx`,
			"no index on keep_until", `CREATE INDEX CONCURRENTLY IF NOT EXISTS "idem_inbox_keep_until_idx" ON "idem_inbox" (keep_until)`, true},
		{"dropped primary key", pgxinbox.Plain, pgxinbox.Plain, `ALTER TABLE idem_inbox DROP CONSTRAINT idem_inbox_pkey`,
			"no unique key on (consumer, key)", `ALTER TABLE "idem_inbox" ADD PRIMARY KEY (consumer, key)`, false},
		{"missing settings row", pgxinbox.Plain, pgxinbox.Plain, `DELETE FROM idem_inbox_settings`,
			"no stored layout and retention window", "idem inbox migrate --table idem_inbox", false},
		{"table of another shape", pgxinbox.Plain, pgxinbox.Plain,
			`DROP TABLE idem_inbox; CREATE TABLE idem_inbox (id bigserial PRIMARY KEY, consumer text, key int, payload jsonb)`,
			"no column message_id, body_sha256, event_time, processed_at, keep_until; key is integer, not text", "rename it aside", false},
		{"wrong layout", pgxinbox.Partitioned, pgxinbox.Plain, ``,
			"has the plain layout, but the store is configured for the partitioned layout", "configure the store for the plain layout", false},
		{"no partition for today", pgxinbox.Partitioned, pgxinbox.Partitioned,
			`DO $$ DECLARE p regclass; BEGIN
			   FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'idem_inbox'::regclass LOOP
			     EXECUTE 'DROP TABLE ' || p; END LOOP; END $$`,
			"no partition for today", "idem inbox partitions ensure --table idem_inbox", false},
		{"no partition for tomorrow", pgxinbox.Partitioned, pgxinbox.Partitioned,
			`DO $$ DECLARE p regclass; BEGIN
			   FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'idem_inbox'::regclass
			     AND inhrelid::regclass::text = 'idem_inbox_p' || to_char((now() AT TIME ZONE 'UTC') + interval '1 day', 'YYYYMMDD') LOOP
			     EXECUTE 'DROP TABLE ' || p; END LOOP; END $$`,
			"no partition for tomorrow", "idem inbox partitions ensure --table idem_inbox", true},
		{"schema older than this build", pgxinbox.Plain, pgxinbox.Plain, `UPDATE idem_migrations SET version = 1`,
			"is at schema version 1; this build needs version 2", "idem inbox migrate --table idem_inbox", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			if err := newStore(t, pool, c.made).Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			store := newStore(t, pool, c.layout)
			if probs := check(t, newStore(t, pool, c.made)); len(probs) != 0 {
				t.Fatalf("freshly migrated table: %v", probs)
			}
			if c.breakf != "" {
				if _, err := pool.Exec(ctx, c.breakf); err != nil {
					t.Fatal(err)
				}
			}
			probs := check(t, store)
			if !hasProblem(probs, c.what, c.fix) {
				t.Fatalf("problems %v, want one saying %q with the fix %q", probs, c.what, c.fix)
			}
			err := consumerOf(t, store).Check(ctx)
			if c.advisory {
				if err != nil {
					t.Fatalf("Processor.Check = %v, want a start: %q is advisory", err, c.what)
				}
				for _, p := range probs {
					if strings.Contains(p.What, c.what) && !p.Advisory {
						t.Fatalf("problem %+v not marked advisory", p)
					}
				}
				return
			}
			var se *idem.SchemaError
			if !errors.Is(err, idem.ErrInboxNotReady) || !errors.Is(err, idem.ErrConfig) || !errors.As(err, &se) ||
				!strings.Contains(err.Error(), c.what) || !strings.Contains(err.Error(), c.fix) {
				t.Fatalf("Processor.Check = %v, want ErrInboxNotReady with a SchemaError saying %q and %q", err, c.what, c.fix)
			}
			if !hasProblem(se.Problems, c.what, c.fix) {
				t.Fatalf("SchemaError problems %v", se.Problems)
			}
		})
	}
}

// TestNewerSchemaIsAdvisory: a table migrated by a newer build is
// reported, with the upgrade as the fix, but a consumer of this build
// starts on it, logging the problem, and claims: migrations only add, and
// an older build keeps running through a rolling deploy.
func TestNewerSchemaIsAdvisory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store := newStore(t, pool, pgxinbox.Plain)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_migrations SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	probs := check(t, store)
	if len(probs) != 1 || !probs[0].Advisory || !hasProblem(probs, "newer than this build of idem knows", "upgrade idem") {
		t.Fatalf("problems %+v, want one advisory problem naming the upgrade", probs)
	}
	var logs syncBuffer
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "billing",
		Key:      idem.ByMessageID,
		Handler:  func(context.Context, pgx.Tx, idem.Message) error { return nil },
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Check(ctx); err != nil {
		t.Fatalf("Processor.Check on a newer schema: %v, want a start", err)
	}
	if !strings.Contains(logs.String(), "newer than this build of idem knows") || !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("log %q, want a warning with the problem", logs.String())
	}
	if r := proc.Process(ctx, idem.Message{ID: "evt-1", Body: []byte("x")}); r.Outcome != idem.Applied {
		t.Fatalf("claim on a newer schema: %v %v", r.Outcome, r.Err)
	}
	if err := store.Migrate(ctx); err == nil || !strings.Contains(err.Error(), "newer than this build") {
		t.Fatalf("Migrate on a newer schema: %v, want a refusal", err)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMigrateReport: Migrate says whether it created, upgraded or found
// the table up to date.
func TestMigrateReport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store := newStore(t, pool, pgxinbox.Plain)
	rep, err := store.MigrateReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "created idem_inbox (plain layout, window 14d, schema version 2)"; rep.String() != want || !rep.Created {
		t.Fatalf("first migrate: %q %+v, want %q", rep, rep, want)
	}
	if rep, err = store.MigrateReport(ctx); err != nil || rep.String() != "idem_inbox is up to date (schema version 2)" {
		t.Fatalf("second migrate: %q %v", rep, err)
	}
	up := pgtest.Pool(t)
	if _, err := up.Exec(ctx, v1Plain+v1Bookkeeping); err != nil {
		t.Fatal(err)
	}
	if rep, err = newStore(t, up, pgxinbox.Plain).MigrateReport(ctx); err != nil || rep.String() != "upgraded idem_inbox from version 1 to 2" {
		t.Fatalf("migrate of a version 1 table: %q %v", rep, err)
	}

	part := newStore(t, pgtest.Pool(t), pgxinbox.Partitioned)
	rep, err = part.MigrateReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("created idem_inbox (partitioned layout, window 14d, schema version 2); created %d daily partitions", 14+1+pgxinbox.DefaultDaysAhead)
	if rep.String() != want {
		t.Fatalf("partitioned migrate: %q, want %q", rep, want)
	}
}

// BenchmarkCheck is what a consumer's start pays for the schema check, and
// the whole Processor.Check around it (schema, settings, probe claim), per
// layout.
func BenchmarkCheck(b *testing.B) {
	for _, layout := range layouts {
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, pgtest.Schema(b))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: layout})
		if err != nil {
			b.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
			Consumer: "billing", Key: idem.ByMessageID,
			Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil },
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(layout.String()+"/Store.Check", func(b *testing.B) {
			for b.Loop() {
				if probs, err := store.Check(ctx); err != nil || len(probs) != 0 {
					b.Fatal(probs, err)
				}
			}
		})
		b.Run(layout.String()+"/Processor.Check", func(b *testing.B) {
			for b.Loop() {
				if err := proc.Check(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCheckDuringAnOutage: a database that turns connections away is an
// outage, not a problem with the table: Processor.Check says it could not
// look (ErrUnavailable, no SchemaError), and passes once the database is
// back.
func TestCheckDuringAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, proxy := pgtest.PoolBehindFault(t)
	store := newStore(t, pool, pgxinbox.Plain)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proc := consumerOf(t, store)
	proxy.Refuse()
	err := proc.Check(ctx)
	var se *idem.SchemaError
	if !errors.Is(err, idem.ErrInboxNotReady) || !errors.Is(err, idem.ErrUnavailable) || errors.As(err, &se) ||
		!strings.Contains(err.Error(), "checking the inbox schema") {
		t.Fatalf("Processor.Check with the database refusing: %v, want ErrInboxNotReady and ErrUnavailable from the schema check", err)
	}
	if _, err := store.Check(ctx); err == nil {
		t.Fatal("Store.Check with the database refusing: no error")
	}
	proxy.Restore()
	if err := proc.Check(ctx); err != nil {
		t.Fatalf("Processor.Check after the outage: %v", err)
	}
}

// TestCheckUnderAnyDateStyle: partition bounds are read in the session's
// DateStyle, so a partitioned consumer starts whatever the database's or
// role's DateStyle is (an ISO-only parse found "no partition for today"
// under SQL, Postgres or German styles and refused to start), and a
// catch-all partition bounded by MINVALUE/MAXVALUE covers today.
func TestCheckUnderAnyDateStyle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Schema(t)
	iso, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(iso.Close)
	if err := newStore(t, iso, pgxinbox.Partitioned).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ds := range []string{"ISO, MDY", "SQL, DMY", "Postgres, MDY", "German"} {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["datestyle"] = ds
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		store := newStore(t, pool, pgxinbox.Partitioned)
		if probs := check(t, store); len(probs) != 0 {
			t.Errorf("DateStyle %s: problems %v, want none", ds, probs)
		}
		if err := consumerOf(t, store).Check(ctx); err != nil {
			t.Errorf("DateStyle %s: consumer refuses to start: %v", ds, err)
		}
		pool.Close()
	}
	// Only a catch-all from MINVALUE to MAXVALUE covers today and tomorrow.
	if _, err := iso.Exec(ctx, `DO $$ DECLARE p regclass; BEGIN
		FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'idem_inbox'::regclass LOOP
		  EXECUTE 'DROP TABLE ' || p; END LOOP; END $$;
		CREATE TABLE idem_inbox_all PARTITION OF idem_inbox FOR VALUES FROM (MINVALUE) TO (MAXVALUE)`); err != nil {
		t.Fatal(err)
	}
	if probs := check(t, newStore(t, iso, pgxinbox.Partitioned)); len(probs) != 0 {
		t.Errorf("a MINVALUE..MAXVALUE partition: problems %v, want none", probs)
	}
}

// TestLeastPrivilegeConsumerStarts: a consumer role granted the inbox and
// its settings but not the migrations' bookkeeping (the tables owned by the
// role a migration tool runs as) starts: the version it cannot read is an
// advisory problem with the GRANT that fixes it, not a refusal.
func TestLeastPrivilegeConsumerStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Schema(t)
	owner, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	if err := newStore(t, owner, pgxinbox.Plain).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := owner.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	role := "idem_consumer_" + strings.TrimPrefix(schema, "t_")
	if len(role) > 60 {
		role = role[:60]
	}
	ident := pgx.Identifier{role}.Sanitize()
	for _, q := range []string{
		`DROP ROLE IF EXISTS ` + ident, `CREATE ROLE ` + ident + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + pgx.Identifier{schema}.Sanitize() + ` TO ` + ident,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON idem_inbox TO ` + ident,
		`GRANT SELECT ON idem_inbox_settings TO ` + ident,
		`GRANT SELECT, INSERT, UPDATE ON idem_inbox_horizons, idem_inbox_pruned TO ` + ident,
	} {
		if _, err := owner.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), `DROP OWNED BY `+ident)
		_, _ = owner.Exec(context.Background(), `DROP ROLE IF EXISTS `+ident)
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store := newStore(t, pool, pgxinbox.Plain)
	probs := check(t, store)
	if len(probs) != 1 || !probs[0].Advisory || !hasProblem(probs, "cannot read", "GRANT SELECT ON") {
		t.Fatalf("problems %+v, want one advisory problem naming the GRANT", probs)
	}
	proc := consumerOf(t, store)
	if err := proc.Check(ctx); err != nil {
		t.Fatalf("consumer refuses to start: %v", err)
	}
	if r := proc.Process(ctx, idem.Message{ID: "evt-1", Body: []byte("x")}); r.Outcome != idem.Applied {
		t.Fatalf("claim as the consumer role: %v %v", r.Outcome, r.Err)
	}
	// The role may not read the consumers' pauses either: reading its
	// pause in the caller's transaction must not abort it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if r, err := consumerOf(t, store).ProcessTx(ctx, tx, idem.Message{ID: "evt-2", Body: []byte("x")}); err != nil || r.Outcome != idem.Applied {
		t.Fatalf("ProcessTx as the consumer role: %+v, %v", r, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
