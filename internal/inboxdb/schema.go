package inboxdb

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// catalog is what the database says about an inbox table: enough to tell
// whether claims, lookups and prunes will work on it.
type catalog struct {
	exists  bool
	relkind string            // PostgreSQL: r (plain), p (partitioned), v, m…
	columns map[string]string // name → type, lower case
	indexes []index
	// partKey is the partition key's columns (PostgreSQL, partitioned).
	partKey string
	// today and tomorrow: a partition covers now and now plus a day.
	today, tomorrow bool
	// versions and settings: the version and the settings tables exist.
	versions, settings bool
	// versionsHidden: the version table exists but this role may not read
	// it (a consumer role granted only the inbox and its settings).
	versionsHidden bool
	// file is the SQLite database's file, for the fixes' commands.
	file string
}

// index is one index of the inbox table.
type index struct {
	name                   string
	unique, valid, partial bool
	columns                []string // key columns in order; "" for an expression
}

// pgCatalog reads the catalog in one statement. $1 the table, $2 and $3 the
// version and settings tables. Partition bounds are read back as the text
// PostgreSQL writes them, in the session's DateStyle and time zone, and cast
// back in the same session, so the round trip is exact whatever those are;
// MINVALUE and MAXVALUE are the infinities, and a partition key that is not
// one timestamptz column (a table of another shape) has no bounds read.
const pgCatalog = `SELECT c.relkind::text,
       coalesce(cols.list, ''), coalesce(idx.list, ''), coalesce(pk.cols, ''),
       coalesce(parts.today, false), coalesce(parts.tomorrow, false),
       to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL,
       NOT coalesce(has_table_privilege(to_regclass($2), 'SELECT'), true)
FROM pg_class c
CROSS JOIN LATERAL (
    SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), E'\n' ORDER BY a.attnum) AS list
    FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) cols
CROSS JOIN LATERAL (
    SELECT string_agg(
        CASE WHEN i.indisunique THEN 'u' ELSE '-' END || CASE WHEN i.indisvalid THEN 'v' ELSE '-' END ||
        CASE WHEN i.indpred IS NULL THEN '-' ELSE 'p' END || ' ' || i.indexrelid::regclass::text || ' ' ||
        (SELECT string_agg(coalesce(a.attname, ''), ',' ORDER BY k.n)
         FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
         LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
         WHERE k.n <= i.indnkeyatts), E'\n') AS list
    FROM pg_index i WHERE i.indrelid = c.oid) idx
CROSS JOIN LATERAL (
    SELECT string_agg(a.attname, ',' ORDER BY k.n) AS cols
    FROM pg_partitioned_table pt CROSS JOIN LATERAL unnest(pt.partattrs::int2[]) WITH ORDINALITY AS k(attnum, n)
    JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = k.attnum
    WHERE pt.partrelid = c.oid) pk
CROSS JOIN LATERAL (
    SELECT bool_or(b.def OR (b.lo <= now() AND now() < b.hi)) AS today,
           bool_or(b.def OR (b.lo <= now() + interval '1 day' AND now() + interval '1 day' < b.hi)) AS tomorrow
    FROM (SELECT r.expr = 'DEFAULT' AS def,
                 CASE WHEN NOT r.ts THEN NULL WHEN r.m[1] = 'MINVALUE' THEN '-infinity'::timestamptz
                      WHEN r.m[1] = 'MAXVALUE' THEN 'infinity'::timestamptz ELSE btrim(r.m[1], '''')::timestamptz END AS lo,
                 CASE WHEN NOT r.ts THEN NULL WHEN r.m[2] = 'MINVALUE' THEN '-infinity'::timestamptz
                      WHEN r.m[2] = 'MAXVALUE' THEN 'infinity'::timestamptz ELSE btrim(r.m[2], '''')::timestamptz END AS hi
          FROM (SELECT e.expr, regexp_match(e.expr, 'FROM \((MINVALUE|MAXVALUE|''[^'']+'')\) TO \((MINVALUE|MAXVALUE|''[^'']+'')\)') AS m,
                       coalesce((SELECT a.atttypid = 'timestamptz'::regtype
                                 FROM pg_partitioned_table pt
                                 JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
                                 WHERE pt.partrelid = c.oid AND pt.partnatts = 1), false) AS ts
                FROM (SELECT pg_get_expr(p.relpartbound, p.oid) AS expr
                      FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhrelid
                      WHERE h.inhparent = c.oid
                      OFFSET 0) e -- OFFSET 0: deparse each bound once, not once per use
                OFFSET 0) r
          OFFSET 0) b) parts
WHERE c.oid = to_regclass($1)`

// readCatalog reads what the database says about d's table.
func (d *Dialect) readCatalog(ctx context.Context, c Conn) (catalog, error) {
	switch d.Name {
	case "postgres":
		return d.pgReadCatalog(ctx, c)
	case "mysql":
		return d.mysqlReadCatalog(ctx, c)
	}
	return d.sqliteReadCatalog(ctx, c)
}

func (d *Dialect) pgReadCatalog(ctx context.Context, c Conn) (catalog, error) {
	cat := catalog{columns: map[string]string{}}
	t := d.Table
	var cols, idx string
	err := c.QueryRow(ctx, pgCatalog, t.Quoted(), t.Sibling(migrationsTable), t.Sibling(settingsTable)).
		Scan(&cat.relkind, &cols, &idx, &cat.partKey, &cat.today, &cat.tomorrow, &cat.versions, &cat.settings, &cat.versionsHidden)
	if isNoRows(err) {
		// The table is missing; are the bookkeeping tables?
		err = c.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
			t.Sibling(migrationsTable), t.Sibling(settingsTable)).Scan(&cat.versions, &cat.settings)
		return cat, err
	}
	if err != nil {
		return cat, err
	}
	cat.exists = true
	for line := range strings.Lines(cols) {
		name, typ, _ := strings.Cut(strings.TrimSpace(line), " ")
		cat.columns[name] = typ
	}
	for line := range strings.Lines(idx) {
		f := strings.SplitN(strings.TrimSpace(line), " ", 3)
		if len(f) < 2 {
			continue
		}
		ix := index{name: f[1], unique: f[0][0] == 'u', valid: f[0][1] == 'v', partial: f[0][2] == 'p'}
		if len(f) == 3 {
			ix.columns = strings.Split(f[2], ",")
		}
		cat.indexes = append(cat.indexes, ix)
	}
	return cat, nil
}

func (d *Dialect) sqliteReadCatalog(ctx context.Context, c Conn) (catalog, error) {
	cat := catalog{columns: map[string]string{}}
	t := d.Table
	err := c.Query(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`, func(r Row) error {
		return r.Scan(&cat.file)
	})
	if err != nil {
		return cat, err
	}
	var n int
	err = c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE name = ?1), count(*) FILTER (WHERE name = ?2) FROM sqlite_master WHERE type = 'table'`,
		migrationsTable, settingsTable).Scan(&cat.versions, &cat.settings)
	if err != nil {
		return cat, err
	}
	if err := c.QueryRow(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1`, t.Name).Scan(&n); err != nil {
		return cat, err
	}
	if n == 0 {
		return cat, nil
	}
	cat.exists, cat.relkind = true, "r"
	err = c.Query(ctx, `SELECT name, type FROM pragma_table_info(?1)`, func(r Row) error {
		var name, typ string
		if err := r.Scan(&name, &typ); err != nil {
			return err
		}
		cat.columns[name] = strings.ToLower(typ)
		return nil
	}, t.Name)
	if err != nil {
		return cat, err
	}
	err = c.Query(ctx, `SELECT name, "unique", partial FROM pragma_index_list(?1)`, func(r Row) error {
		var ix index
		var unique, partial int
		if err := r.Scan(&ix.name, &unique, &partial); err != nil {
			return err
		}
		ix.unique, ix.partial, ix.valid = unique == 1, partial == 1, true
		cat.indexes = append(cat.indexes, ix)
		return nil
	}, t.Name)
	if err != nil {
		return cat, err
	}
	for i := range cat.indexes {
		ix := &cat.indexes[i]
		err := c.Query(ctx, `SELECT coalesce(name, '') FROM pragma_index_info(?1) ORDER BY seqno`, func(r Row) error {
			var col string
			if err := r.Scan(&col); err != nil {
				return err
			}
			ix.columns = append(ix.columns, col)
			return nil
		}, ix.name)
		if err != nil {
			return cat, err
		}
	}
	return cat, nil
}

// wantColumns is each dialect's inbox columns and their types, as its
// catalog writes them.
func (d *Dialect) wantColumns() [][2]string {
	if d.Name == "mysql" {
		return mysqlColumns
	}
	if d.Name == "postgres" {
		ts := "timestamp with time zone"
		cols := [][2]string{{"consumer", "text"}, {"key", "text"}, {"message_id", "text"}, {"body_sha256", "bytea"},
			{"event_time", ts}, {"processed_at", ts}, {"keep_until", ts}}
		if d.Layout == idemstore.LayoutPartitioned {
			cols = append(cols, [2]string{"partition_time", ts})
		}
		return cols
	}
	return [][2]string{{"consumer", "text"}, {"key", "text"}, {"message_id", "text"}, {"body_sha256", "blob"},
		{"event_time", "text"}, {"processed_at", "text"}, {"keep_until", "text"}}
}

// uniqueKey is the columns of the unique key every claim's ON CONFLICT
// names.
func (d *Dialect) uniqueKey() []string {
	if d.Layout == idemstore.LayoutPartitioned {
		return []string{"consumer", "key", "partition_time"}
	}
	return []string{"consumer", "key"}
}

// commands is how the fixes name the table on the command line.
func (d *Dialect) commands(cat catalog) (target, migrate string) {
	target = "--table " + d.Table.String()
	if d.Name == "sqlite" {
		file := cat.file
		if file == "" {
			file = "<database file>"
		}
		target = "--sqlite " + file + " " + target
	}
	migrate = "idem inbox migrate " + target
	if d.Layout == idemstore.LayoutPartitioned {
		migrate += " --layout partitioned"
	}
	return target, migrate
}

// Check verifies the inbox table (see [idemstore.Store.Check]): it reads the
// catalog, the schema version and the settings, in two statements on
// PostgreSQL, and returns each problem with its fix. An error means it
// could not look.
func (b *Inbox) Check(ctx context.Context) ([]idemstore.SchemaProblem, error) {
	var probs []idemstore.SchemaProblem
	err := b.read(ctx, func(c Conn) error {
		cat, err := b.D.readCatalog(ctx, c)
		if err != nil {
			return fmt.Errorf("reading the catalog: %w", err)
		}
		probs, err = b.checkCatalog(ctx, c, cat)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("checking inbox table %s: %w", b.D.Table, err)
	}
	return probs, nil
}

func (b *Inbox) checkCatalog(ctx context.Context, c Conn, cat catalog) ([]idemstore.SchemaProblem, error) {
	d := b.D
	t := d.Table
	target, migrate := d.commands(cat)
	var probs []idemstore.SchemaProblem
	add := func(fix, what string, args ...any) {
		probs = append(probs, idemstore.SchemaProblem{What: fmt.Sprintf(what, args...), Fix: fix})
	}
	latest, err := d.LatestVersion()
	if err != nil {
		return nil, err
	}
	// The version first: a newer schema is the one problem a migrate must
	// not be suggested for.
	version, hasVersion := 0, false
	if cat.versions && cat.versionsHidden {
		// Advisory: a least-privilege consumer role need not read the
		// migrations' bookkeeping; the shape checks below still run.
		add("GRANT SELECT ON "+t.Sibling(migrationsTable)+" TO the consumer's role, so the schema version can be checked",
			"this role cannot read %s (no SELECT privilege): the schema version of %s is not checked", t.Sibling(migrationsTable), t)
		probs[len(probs)-1].Advisory = true
		version, hasVersion = latest, true
	} else if cat.versions {
		err := c.QueryRow(ctx, d.ReadVersion, t.Quoted()).Scan(&version)
		switch {
		case err == nil:
			hasVersion = true
		case !isNoRows(err):
			return nil, fmt.Errorf("reading schema version: %w", err)
		}
	}
	if version > latest {
		// Advisory: a rolling deploy migrates while consumers of the older
		// build still run, and must not be stopped by their restarts
		// (migrations keep older claims working where they can, as with
		// keep_until's default; a claim that fails is held, never lost).
		add("upgrade idem (this program or the consumer's module) to the release that migrated the table; never migrate an inbox down",
			"table %s has schema version %d, newer than this build of idem knows (%d): this binary is older than the one that migrated it", t, version, latest)
		probs[len(probs)-1].Advisory = true
	}
	if !cat.exists {
		add(migrate, "table %s does not exist", t)
		return probs, nil
	}
	switch want := map[idemstore.Layout]string{idemstore.LayoutPlain: "r", idemstore.LayoutPartitioned: "p"}[d.Layout]; {
	case cat.relkind == want:
	case cat.relkind == "r" || cat.relkind == "p":
		other := map[string]idemstore.Layout{"r": idemstore.LayoutPlain, "p": idemstore.LayoutPartitioned}[cat.relkind]
		add("configure the store for the "+other.String()+" layout, or name another table for the "+d.Layout.String()+" one",
			"table %s has the %s layout, but the store is configured for the %s layout", t, other, d.Layout)
	default:
		add("name another table, or move this one aside and run: "+migrate, "%s is not a table (relkind %q)", t, cat.relkind)
		return probs, nil
	}
	upToDate := hasVersion && version >= latest
	if missing := cat.missingFirstColumns(); len(missing) > 0 && !upToDate {
		// Not an older inbox that migrate would upgrade: migrate refuses
		// it. (At this build's version, the column check below says what
		// was changed by hand.)
		e := NotInboxError{Table: t.String(), Missing: missing}
		add("name another table with --table, or rename it aside (ALTER TABLE "+t.Quoted()+" RENAME TO …) and run: "+migrate, "%s", e.What())
		return probs, nil
	}
	if hasVersion && version < latest {
		add(migrate, "table %s is at schema version %d; this build needs version %d", t, version, latest)
	} else if !hasVersion {
		add(migrate, "table %s has no recorded schema version (created by hand, or by a build older than versioned migrations)", t)
	}
	var missing, wrong []string
	for _, col := range d.wantColumns() {
		got, ok := cat.columns[col[0]]
		switch {
		case !ok:
			missing = append(missing, col[0])
		case got != col[1]:
			wrong = append(wrong, fmt.Sprintf("%s is %s, not %s", col[0], got, col[1]))
		}
	}
	if len(missing)+len(wrong) > 0 {
		var what []string
		if len(missing) > 0 {
			what = append(what, "no column "+strings.Join(missing, ", "))
		}
		what = append(what, wrong...)
		fix := migrate
		if upToDate {
			fix = "the table is not shaped like an idem inbox (changed by hand, or another table of that name): rename it aside (ALTER TABLE " +
				t.Quoted() + " RENAME TO …) and run: " + migrate + ", or name another table"
		}
		add(fix, "table %s: %s", t, strings.Join(what, "; "))
	}
	key := d.uniqueKey()
	if !slices.ContainsFunc(cat.indexes, func(ix index) bool {
		return ix.unique && ix.valid && !ix.partial && sameSet(ix.columns, key)
	}) {
		fix := migrate
		if upToDate {
			fix = "ALTER TABLE " + t.Quoted() + " ADD PRIMARY KEY (" + strings.Join(key, ", ") + ") (it fails while duplicate markers exist: find them first)"
		}
		add(fix,
			"table %s has no unique key on (%s): nothing stops two deliveries of one message from both applying, and every claim fails",
			t, strings.Join(key, ", "))
	}
	if d.Layout == idemstore.LayoutPlain && cat.columns["keep_until"] != "" &&
		!slices.ContainsFunc(cat.indexes, func(ix index) bool {
			return ix.valid && len(ix.columns) > 0 && ix.columns[0] == "keep_until"
		}) {
		fix := migrate
		if upToDate {
			concurrently := ""
			if d.Name == "postgres" {
				concurrently = "CONCURRENTLY "
			}
			fix = "CREATE INDEX " + concurrently + "IF NOT EXISTS " + quoteIdent(t.IndexName("keep_until")) + " ON " + t.Quoted() + " (keep_until)"
		}
		add(fix, "table %s has no index on keep_until: every prune scans the whole table", t)
		// Advisory: claims do not need it; a consumer starts and logs it.
		probs[len(probs)-1].Advisory = true
	}
	if cat.relkind == "p" && d.Layout == idemstore.LayoutPartitioned {
		if cat.partKey != "partition_time" && upToDate {
			add("name another table and run: "+migrate, "table %s is partitioned by (%s), not by partition_time", t, cat.partKey)
		}
		switch {
		case !cat.today:
			add("idem inbox partitions ensure "+target+" (and run it daily)", "table %s has no partition for today (UTC): every claim fails", t)
		case !cat.tomorrow:
			add("idem inbox partitions ensure "+target+" (and run it daily)", "table %s has no partition for tomorrow (UTC): claims fail from midnight", t)
			// Advisory: today's claims work; refusing to start would turn a
			// late daily job into an outage now rather than at midnight.
			probs[len(probs)-1].Advisory = true
		}
	}
	if !cat.settings {
		add(migrate, "table %s has no stored layout and retention window (the settings table is missing)", t)
		return probs, nil
	}
	var layout string
	var ms int64
	var prev, since *int64
	err = c.QueryRow(ctx, d.ReadSettings, t.Quoted()).Scan(&layout, &ms, &prev, &since)
	switch {
	case isNoRows(err):
		add(migrate, "table %s has no stored layout and retention window", t)
	case err != nil:
		return nil, fmt.Errorf("reading the inbox settings: %w", err)
	default:
		if layout != d.Layout.String() {
			add("configure the store for the layout the table has, or name another table",
				"table %s is recorded with the %q layout, but the store is configured for the %s layout", t, layout, d.Layout)
		}
		if w := time.Duration(ms) * time.Millisecond; w <= 0 {
			add(fmt.Sprintf("idem inbox window set %dh %s", DefaultWindow/time.Hour, target),
				"table %s has a stored retention window of %v: markers would be pruned at once", t, w)
		}
	}
	return probs, nil
}

// sameSet reports whether a and b hold the same names.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			return false
		}
	}
	return true
}

// tableExists reports whether d's table exists.
func (d *Dialect) tableExists(ctx context.Context, c Conn) (bool, error) {
	if d.Name == "mysql" {
		return d.mysqlTableExists(ctx, c)
	}
	var ok bool
	var err error
	if d.Name == "postgres" {
		err = c.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, d.Table.Quoted()).Scan(&ok)
	} else {
		var n int
		err = c.QueryRow(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1`, d.Table.Name).Scan(&n)
		ok = n > 0
	}
	return ok, err
}
