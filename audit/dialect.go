package audit

import (
	"fmt"
	"strings"
	"time"
)

// dialect renders every statement the audit runs for one database engine.
// The operations above it (report, void, guard, check) only choose which
// statement to run and read its columns in a fixed order, so a second engine
// is one more implementation of this interface plus a runner for its driver.
//
// Parameters shared by the row statements: $1 the void value, $2 the paid
// values (text[]). Each method documents any further ones.
//
// The MySQL dialect (dialect_mysql.go) differs where MySQL does: no partial
// indexes (the guard is a unique index on the key plus a generated column
// that is NULL for voided rows), no "IS DISTINCT FROM" (NOT (a <=> b)), no
// RETURNING (void updates the listed ids and compares the count), no
// arrays (a []string argument binds as an IN list), and casts to CHAR.
type dialect interface {
	quote(Ident) string
	// groups lists duplicate groups, newest first; $3 limits them (NULL: all).
	groups(p *plan) string
	// summary aggregates all duplicate groups and returns the database clock.
	summary(p *plan) string
	// rows lists the extra rows (all but the earliest of each group), each
	// with whether it is paid.
	rows(p *plan) string
	// void marks extra rows as voided and returns their ids; $3 includes paid
	// rows, $4 reason, $5 actor, $6 the void value again, untyped, so that
	// an enum status column accepts it.
	void(p *plan) string
	// check counts duplicate groups and extra rows among live rows.
	check(p *plan) string
	// addColumns adds the missing audit columns, idempotently.
	addColumns(p *plan, cols []Ident) string
	// guardDDL is the unique index on the key over live rows, as shown to
	// a reader (one or more statements, separated by ";\n").
	guardDDL(p *plan, index Ident) string
	// guardStatements are the statements Guard runs, in order, on one
	// session, given what the catalog says of the table.
	guardStatements(p *plan, index Ident, ti *tableInfo) ([]string, error)
	dropIndex(p *plan, schema string, index Ident) string
	setLockTimeout() string
	lockTimeoutArg(d time.Duration) any
	// Catalog: table lists (id, schema id, schema, name, kind "r" or "p"
	// for a table).
	table() string
	tableArgs(p *plan) []any
	// columns lists (name, type, not null).
	columns() string
	columnsArgs(ti *tableInfo) []any
	// indexByName returns (on the table, unique, valid, definition).
	indexByName() string
	indexByNameArgs(ti *tableInfo, index string) []any
	// uniqueOnKey lists (name, valid, definition) of the unique indexes
	// on exactly the key; names are sorted.
	uniqueOnKey() string
	uniqueOnKeyArgs(ti *tableInfo, names []string) []any
	// duplicate reports a unique violation and its detail; conflict a
	// serialization failure, deadlock or lock wait timeout.
	duplicate(err error) (string, bool)
	conflict(err error) bool
	// failedBuildLeavesIndex: a failed guard build leaves an invalid
	// index behind that must be dropped.
	failedBuildLeavesIndex() bool
	// fencesNullStatus: the guard constrains rows whose status is NULL.
	fencesNullStatus() bool
	// ddlCommits: DDL commits the open transaction.
	ddlCommits() bool
	// voidByID: void takes $7, the ids listed, and returns no rows; the
	// caller compares the count changed.
	voidByID() bool
}

type postgres struct{}

func (postgres) quote(id Ident) string { return quoteIdentANSI(id) }

func (d postgres) cols(ids []Ident, prefix string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = prefix + d.quote(id)
	}
	return strings.Join(out, ", ")
}

// live is the predicate for rows that count: not voided (NULL status counts
// as live; without a status column every row is) and no NULL in the key.
// $1 is referenced either way, so every statement takes the same
// parameters.
func (d postgres) live(p *plan, alias string) string {
	var b strings.Builder
	if p.status != nil {
		fmt.Fprintf(&b, "%s%s::text IS DISTINCT FROM $1::text", alias, d.quote(p.status))
	} else {
		// Always true (the void value is never empty); it keeps $1 in the
		// statement, since PostgreSQL refuses a parameter it is not given
		// a place for.
		b.WriteString("$1::text IS NOT NULL")
	}
	for _, k := range p.key {
		fmt.Fprintf(&b, " AND %s%s IS NOT NULL", alias, d.quote(k))
	}
	return b.String()
}

// rowID is the expression that names a row: the id column, or without one
// the row's physical address, stable within the statement's snapshot.
func (d postgres) rowID(p *plan, alias string) string {
	if p.id == nil {
		return alias + "ctid"
	}
	return alias + d.quote(p.id)
}

// ranked numbers the live rows of each duplicated key: rn 1 is the
// earliest (ties broken by id), n is the group's size, keep the id of the
// row kept. The keys are found first with a grouping (a hash aggregate), so
// only the rows of duplicated keys are sorted, not the whole table.
func (d postgres) ranked(p *plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "WITH dupkeys AS (\n  SELECT %s FROM %s AS t\n  WHERE %s\n  GROUP BY %s HAVING count(*) > 1\n),\n",
		d.cols(p.key, "t."), d.quote(p.table), d.live(p, "t."), d.cols(p.key, "t."))
	b.WriteString("ranked AS (\n  SELECT ")
	for i, k := range p.key {
		fmt.Fprintf(&b, "t.%s AS k%d, ", d.quote(k), i)
	}
	amount := "NULL::numeric"
	if p.amount != nil {
		amount = "t." + d.quote(p.amount)
	}
	if p.status != nil {
		fmt.Fprintf(&b, "%s AS rid, t.%s AS rt, %s AS ram, t.%s::text AS rstatus,\n", d.rowID(p, "t."), d.quote(p.time), amount, d.quote(p.status))
		fmt.Fprintf(&b, "    CASE WHEN t.%s::text = ANY($2::text[]) THEN 1 ELSE 0 END AS paid,\n", d.quote(p.status))
	} else {
		// No status: nothing is voided, and nothing is known to be paid
		// ($2 stays in the statement for the same reason as $1 in live).
		fmt.Fprintf(&b, "%s AS rid, t.%s AS rt, %s AS ram, NULL::text AS rstatus,\n", d.rowID(p, "t."), d.quote(p.time), amount)
		b.WriteString("    CASE WHEN $2::text[] IS NULL THEN 0 ELSE 0 END AS paid,\n")
	}
	b.WriteString("    row_number() OVER o AS rn, count(*) OVER g AS n, first_value(" + d.rowID(p, "t.") + "::text) OVER o AS keep\n")
	fmt.Fprintf(&b, "  FROM %s AS t JOIN dupkeys AS dk ON ", d.quote(p.table))
	for i, k := range p.key {
		if i > 0 {
			b.WriteString(" AND ")
		}
		fmt.Fprintf(&b, "dk.%[1]s = t.%[1]s", d.quote(k))
	}
	fmt.Fprintf(&b, "\n  WHERE %s\n", d.live(p, "t."))
	fmt.Fprintf(&b, "  WINDOW g AS (PARTITION BY %s), o AS (g ORDER BY t.%s, %s)\n)\n", d.cols(p.key, "t."), d.quote(p.time), d.rowID(p, "t."))
	return b.String()
}

func keyAliases(p *plan, suffix string) string {
	out := make([]string, len(p.key))
	for i := range p.key {
		out[i] = fmt.Sprintf("k%d%s", i, suffix)
	}
	return strings.Join(out, ", ")
}

func (d postgres) groups(p *plan) string {
	return d.ranked(p) + "SELECT " + keyAliases(p, "::text") + `,
  count(*), min(rt)::timestamptz, max(rt)::timestamptz,
  sum(ram)::text, sum(CASE WHEN rn > 1 THEN ram END)::text,
  sum(paid), sum(CASE WHEN rn > 1 THEN paid ELSE 0 END), min(keep)
FROM ranked WHERE n > 1
GROUP BY ` + keyAliases(p, "") + `
ORDER BY max(rt) DESC NULLS LAST, ` + keyAliases(p, "") + `
LIMIT $3`
}

func (d postgres) summary(p *plan) string {
	return d.ranked(p) + `SELECT count(CASE WHEN rn = 1 THEN 1 END), count(*), count(CASE WHEN rn > 1 THEN 1 END),
  sum(ram)::text, sum(CASE WHEN rn > 1 THEN ram END)::text,
  count(CASE WHEN paid = 1 THEN 1 END),
  count(CASE WHEN rn > 1 AND paid = 1 THEN 1 END), sum(CASE WHEN rn > 1 AND paid = 1 THEN ram END)::text,
  sum(CASE WHEN rn > 1 AND paid = 0 THEN ram END)::text,
  max(CASE WHEN rn > 1 THEN rt END)::timestamptz, now()
FROM ranked WHERE n > 1`
}

func (d postgres) rows(p *plan) string {
	return d.ranked(p) + "SELECT rid::text, keep, " + keyAliases(p, "::text") + `, rt::timestamptz, ram::text, rstatus, paid = 1
FROM ranked WHERE n > 1 AND rn > 1
ORDER BY ` + keyAliases(p, "") + `, rn`
}

func (d postgres) void(p *plan) string {
	prev := ""
	if p.prev != nil {
		// SET reads the row as it was, so this keeps the old status.
		prev = fmt.Sprintf(", %s = u.%s::text", d.quote(p.prev), d.quote(p.status))
	}
	return d.ranked(p) + fmt.Sprintf(`UPDATE %[1]s AS u
SET %[2]s = $6, %[3]s = $4, %[4]s = $5, %[5]s = now()%[7]s
WHERE u.%[6]s IN (SELECT rid FROM ranked WHERE n > 1 AND rn > 1 AND ($3::boolean OR paid = 0))
  AND u.%[2]s::text IS DISTINCT FROM $1::text
  AND ($3::boolean OR NOT coalesce(u.%[2]s::text = ANY($2::text[]), false))
RETURNING u.%[6]s::text`,
		d.quote(p.table), d.quote(p.status), d.quote(p.reason), d.quote(p.actor), d.quote(p.voidedAt), d.quote(p.id), prev)
}

func (d postgres) check(p *plan) string {
	return fmt.Sprintf(`SELECT count(*), coalesce(sum(c - 1), 0) FROM (
  SELECT count(*) AS c FROM %s AS t WHERE %s
  GROUP BY %s HAVING count(*) > 1
) AS d`, d.quote(p.table), d.live(p, "t."), d.cols(p.key, "t."))
}

func (d postgres) addColumns(p *plan, cols []Ident) string {
	types := map[string]string{p.reason.Name(): "text", p.actor.Name(): "text", p.voidedAt.Name(): "timestamptz"}
	if p.prev != nil {
		types[p.prev.Name()] = "text"
	}
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = fmt.Sprintf("ADD COLUMN IF NOT EXISTS %s %s", d.quote(c), types[c.Name()])
	}
	return fmt.Sprintf("ALTER TABLE %s %s", d.quote(p.table), strings.Join(parts, ", "))
}

func (d postgres) guardDDL(p *plan, index Ident) string {
	if p.status == nil {
		// Every row is live: the fence is the whole table.
		return fmt.Sprintf("CREATE UNIQUE INDEX CONCURRENTLY %s ON %s (%s)", d.quote(index), d.quote(p.table), d.cols(p.key, ""))
	}
	// DDL takes no bind parameters: the void value is a literal, safe
	// because compile restricted it to an alphabet with no quote.
	return fmt.Sprintf("CREATE UNIQUE INDEX CONCURRENTLY %s ON %s (%s) WHERE %s <> '%s'",
		d.quote(index), d.quote(p.table), d.cols(p.key, ""), d.quote(p.status), strings.ReplaceAll(p.spec.VoidValue, "'", "''"))
}

func (d postgres) dropIndex(p *plan, schema string, index Ident) string {
	return "DROP INDEX CONCURRENTLY IF EXISTS " + d.quote(Ident{schema, index.Name()})
}

func (postgres) setLockTimeout() string { return "SELECT set_config('lock_timeout', $1, true)" }

func (postgres) lockTimeoutArg(d time.Duration) any { return fmt.Sprintf("%dms", d.Milliseconds()) }

func (d postgres) guardStatements(p *plan, index Ident, _ *tableInfo) ([]string, error) {
	return []string{d.guardDDL(p, index)}, nil
}

func (d postgres) tableArgs(p *plan) []any          { return []any{d.quote(p.table)} }
func (postgres) columnsArgs(ti *tableInfo) []any    { return []any{ti.oid} }
func (postgres) duplicate(err error) (string, bool) { return pgDuplicate(err) }
func (postgres) conflict(err error) bool            { return pgConflict(err) }
func (postgres) failedBuildLeavesIndex() bool       { return true }
func (postgres) fencesNullStatus() bool             { return false }
func (postgres) ddlCommits() bool                   { return false }
func (postgres) voidByID() bool                     { return false }
func (postgres) uniqueOnKeyArgs(ti *tableInfo, names []string) []any {
	return []any{ti.oid, len(names), names}
}

func (postgres) indexByNameArgs(ti *tableInfo, index string) []any {
	return []any{ti.schemaOID, index, ti.oid}
}

func (postgres) table() string {
	return `SELECT c.oid, c.relnamespace, n.nspname::text, c.relname::text, c.relkind::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`
}

func (postgres) columns() string {
	return `SELECT attname::text, format_type(atttypid, atttypmod), attnotnull
FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`
}

func (postgres) indexByName() string {
	return `SELECT i.indrelid = $3, i.indisunique, i.indisvalid, pg_get_indexdef(i.indexrelid)
FROM pg_class ic JOIN pg_index i ON i.indexrelid = ic.oid
WHERE ic.relnamespace = $1 AND ic.relname = $2`
}

func (postgres) uniqueOnKey() string {
	return `SELECT ic.relname::text, i.indisvalid, pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
WHERE i.indrelid = $1 AND i.indisunique AND i.indexprs IS NULL AND i.indnkeyatts = $2
  AND (SELECT array_agg(a.attname::text ORDER BY a.attname)
       FROM pg_attribute a
       WHERE a.attrelid = i.indrelid AND a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1])) = $3::text[]
ORDER BY i.indisvalid DESC, ic.relname`
}
