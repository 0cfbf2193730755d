package audit

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mysqlDialect is MySQL 8 and MariaDB 10.6: backtick-quoted names, ? binds
// (written here as $n and rewritten by bindMySQL), no partial index, no
// RETURNING, no arrays (a []string argument expands to an IN list).
type mysqlDialect struct{}

func (mysqlDialect) quote(id Ident) string {
	var b strings.Builder
	for i, p := range id {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteByte('`')
		b.WriteString(strings.ReplaceAll(p, "`", "``"))
		b.WriteByte('`')
	}
	return b.String()
}

func (d mysqlDialect) cols(ids []Ident, prefix string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = prefix + d.quote(id)
	}
	return strings.Join(out, ", ")
}

// status is the status column as bytes, so that statuses compare exactly
// whatever the column's collation (an ENUM gives its label).
func (d mysqlDialect) status(p *plan, alias string) string {
	return "CAST(" + alias + d.quote(p.status) + " AS BINARY)"
}

func (d mysqlDialect) live(p *plan, alias string) string {
	var b strings.Builder
	if p.status != nil {
		fmt.Fprintf(&b, "NOT (%s <=> $1)", d.status(p, alias))
	} else {
		b.WriteString("$1 IS NOT NULL")
	}
	for _, k := range p.key {
		fmt.Fprintf(&b, " AND %s%s IS NOT NULL", alias, d.quote(k))
	}
	return b.String()
}

func (d mysqlDialect) ranked(p *plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "WITH dupkeys AS (\n  SELECT %s FROM %s AS t\n  WHERE %s\n  GROUP BY %s HAVING count(*) > 1\n),\n",
		d.cols(p.key, "t."), d.quote(p.table), d.live(p, "t."), d.cols(p.key, "t."))
	b.WriteString("ranked AS (\n  SELECT ")
	for i, k := range p.key {
		fmt.Fprintf(&b, "t.%s AS k%d, ", d.quote(k), i)
	}
	amount := "NULL"
	if p.amount != nil {
		amount = "t." + d.quote(p.amount)
	}
	id := "t." + d.quote(p.id)
	if p.status != nil {
		fmt.Fprintf(&b, "%s AS rid, t.%s AS rt, %s AS ram, CAST(t.%s AS CHAR) AS rstatus,\n", id, d.quote(p.time), amount, d.quote(p.status))
		fmt.Fprintf(&b, "    CASE WHEN %s IN ($2) THEN 1 ELSE 0 END AS paid,\n", d.status(p, "t."))
	} else {
		fmt.Fprintf(&b, "%s AS rid, t.%s AS rt, %s AS ram, NULL AS rstatus, 0 AS paid,\n", id, d.quote(p.time), amount)
	}
	part := "PARTITION BY " + d.cols(p.key, "t.")
	// PostgreSQL sorts NULL times last; so does this.
	order := fmt.Sprintf("ORDER BY t.%[1]s IS NULL, t.%[1]s, %[2]s", d.quote(p.time), id)
	fmt.Fprintf(&b, "    row_number() OVER (%[1]s %[2]s) AS rn, count(*) OVER (%[1]s) AS n, first_value(CAST(%[3]s AS CHAR)) OVER (%[1]s %[2]s) AS keep\n", part, order, id)
	fmt.Fprintf(&b, "  FROM %s AS t JOIN dupkeys AS dk ON ", d.quote(p.table))
	for i, k := range p.key {
		if i > 0 {
			b.WriteString(" AND ")
		}
		fmt.Fprintf(&b, "dk.%[1]s = t.%[1]s", d.quote(k))
	}
	fmt.Fprintf(&b, "\n  WHERE %s\n)\n", d.live(p, "t."))
	return b.String()
}

func (d mysqlDialect) keysAsText(p *plan) string {
	out := make([]string, len(p.key))
	for i := range p.key {
		out[i] = fmt.Sprintf("CAST(k%d AS CHAR)", i)
	}
	return strings.Join(out, ", ")
}

func (d mysqlDialect) groups(p *plan) string {
	return d.ranked(p) + "SELECT " + d.keysAsText(p) + `,
  count(*), min(rt), max(rt),
  CAST(sum(ram) AS CHAR), CAST(sum(CASE WHEN rn > 1 THEN ram END) AS CHAR),
  sum(paid), sum(CASE WHEN rn > 1 THEN paid ELSE 0 END), min(keep)
FROM ranked WHERE n > 1
GROUP BY ` + keyAliases(p, "") + `
ORDER BY max(rt) IS NULL, max(rt) DESC, ` + keyAliases(p, "") + `
LIMIT $3`
}

func (d mysqlDialect) summary(p *plan) string {
	return d.ranked(p) + `SELECT count(CASE WHEN rn = 1 THEN 1 END), count(*), count(CASE WHEN rn > 1 THEN 1 END),
  CAST(sum(ram) AS CHAR), CAST(sum(CASE WHEN rn > 1 THEN ram END) AS CHAR),
  count(CASE WHEN paid = 1 THEN 1 END),
  count(CASE WHEN rn > 1 AND paid = 1 THEN 1 END), CAST(sum(CASE WHEN rn > 1 AND paid = 1 THEN ram END) AS CHAR),
  CAST(sum(CASE WHEN rn > 1 AND paid = 0 THEN ram END) AS CHAR),
  max(CASE WHEN rn > 1 THEN rt END), now(6)
FROM ranked WHERE n > 1`
}

func (d mysqlDialect) rows(p *plan) string {
	return d.ranked(p) + "SELECT CAST(rid AS CHAR), keep, " + d.keysAsText(p) + `, rt, CAST(ram AS CHAR), rstatus, paid = 1
FROM ranked WHERE n > 1 AND rn > 1
ORDER BY ` + keyAliases(p, "") + `, rn`
}

// void updates the listed ids ($7) that are still live and, unless $3,
// unpaid. Single-table UPDATE assigns left to right, so the previous
// status is copied before the status changes.
func (d mysqlDialect) void(p *plan) string {
	prev := ""
	if p.prev != nil {
		prev = fmt.Sprintf("%s = CAST(%s AS CHAR), ", d.quote(p.prev), d.quote(p.status))
	}
	return fmt.Sprintf(`UPDATE %[1]s
SET %[7]s%[2]s = $6, %[3]s = $4, %[4]s = $5, %[5]s = now(6)
WHERE %[6]s IN ($7)
  AND NOT (%[8]s <=> $1)
  AND ($3 OR NOT coalesce(%[8]s IN ($2), false))`,
		d.quote(p.table), d.quote(p.status), d.quote(p.reason), d.quote(p.actor), d.quote(p.voidedAt), d.quote(p.id), prev, d.status(p, ""))
}

func (d mysqlDialect) check(p *plan) string {
	return fmt.Sprintf(`SELECT count(*), coalesce(sum(c - 1), 0) FROM (
  SELECT count(*) AS c FROM %s AS t WHERE %s
  GROUP BY %s HAVING count(*) > 1
) AS d`, d.quote(p.table), d.live(p, "t."), d.cols(p.key, "t."))
}

func (d mysqlDialect) addColumns(p *plan, cols []Ident) string {
	types := map[string]string{p.reason.Name(): "TEXT NULL", p.actor.Name(): "TEXT NULL", p.voidedAt.Name(): "DATETIME(6) NULL"}
	if p.prev != nil {
		types[p.prev.Name()] = "TEXT NULL"
	}
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = fmt.Sprintf("ADD COLUMN %s %s", d.quote(c), types[c.Name()])
	}
	return fmt.Sprintf("ALTER TABLE %s %s", d.quote(p.table), strings.Join(parts, ", "))
}

// liveColumnDDL adds the generated column: 1 for a live row, NULL for a
// voided one. VIRTUAL: nothing is stored, so adding it does not rebuild the
// table. The void value is a literal (DDL takes no parameters), safe
// because compile restricted it to an alphabet with no quote or backslash.
func (d mysqlDialect) liveColumnDDL(p *plan) string {
	return fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s TINYINT AS (IF(%s <=> '%s', NULL, 1)) VIRTUAL, ALGORITHM=INPLACE, LOCK=NONE",
		d.quote(p.table), d.quote(Ident{liveColumn}), d.status(p, ""), p.spec.VoidValue)
}

func (d mysqlDialect) indexDDL(p *plan, index Ident) string {
	cols := d.cols(p.key, "")
	if p.status != nil {
		cols += ", " + d.quote(Ident{liveColumn})
	}
	return fmt.Sprintf("ALTER TABLE %s ADD UNIQUE INDEX %s (%s), ALGORITHM=INPLACE, LOCK=NONE", d.quote(p.table), d.quote(index), cols)
}

func (d mysqlDialect) guardDDL(p *plan, index Ident) string {
	if p.status == nil {
		return d.indexDDL(p, index)
	}
	return d.liveColumnDDL(p) + ";\n" + d.indexDDL(p, index)
}

// guardStatements adds the live column unless an earlier guard did; one
// that computes something else (another void value or status column) is
// refused rather than trusted.
func (d mysqlDialect) guardStatements(p *plan, index Ident, ti *tableInfo) ([]string, error) {
	var out []string
	if p.status != nil {
		c, ok := ti.cols[liveColumn]
		switch {
		case !ok:
			out = append(out, d.liveColumnDDL(p))
		case !strings.Contains(c.typ, "'"+p.spec.VoidValue+"'") || !strings.Contains(c.typ, d.quote(p.status)):
			return nil, fmt.Errorf("%w: column %s of %s is %s, not the live flag for status %s and void value %s; drop it or rename it",
				ErrIndexNameTaken, liveColumn, p.table, c.typ, p.status, p.spec.VoidValue)
		}
	}
	return append(out, d.indexDDL(p, index)), nil
}

func (d mysqlDialect) dropIndex(p *plan, _ string, index Ident) string {
	return fmt.Sprintf("ALTER TABLE %s DROP INDEX %s", d.quote(p.table), d.quote(index))
}

func (mysqlDialect) setLockTimeout() string {
	return "SET SESSION innodb_lock_wait_timeout = $1, lock_wait_timeout = $1"
}

// lockTimeoutArg is whole seconds, rounded up: both variables take no less.
func (mysqlDialect) lockTimeoutArg(d time.Duration) any {
	return int64(max(1, (d+time.Second-1)/time.Second))
}

func (mysqlDialect) table() string {
	return `SELECT 0, 0, TABLE_SCHEMA, TABLE_NAME, CASE WHEN TABLE_TYPE = 'BASE TABLE' THEN 'r' ELSE 'v' END
FROM information_schema.TABLES
WHERE TABLE_SCHEMA = coalesce($1, DATABASE()) AND CAST(TABLE_NAME AS BINARY) = $2`
}

func (mysqlDialect) tableArgs(p *plan) []any {
	var schema any
	if len(p.table) == 2 {
		schema = p.table[0]
	}
	return []any{schema, p.table.Name()}
}

func (mysqlDialect) columns() string {
	return `SELECT COLUMN_NAME,
  CASE WHEN coalesce(GENERATION_EXPRESSION, '') = '' THEN COLUMN_TYPE ELSE concat(COLUMN_TYPE, ' AS (', GENERATION_EXPRESSION, ')') END,
  IS_NULLABLE = 'NO'
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = $1 AND TABLE_NAME = $2 ORDER BY ORDINAL_POSITION`
}

func (mysqlDialect) columnsArgs(ti *tableInfo) []any { return []any{ti.schema, ti.name} }

// indexDef renders an index from information_schema.STATISTICS.
const mysqlIndexDef = `concat(CASE WHEN max(NON_UNIQUE) = 0 THEN 'UNIQUE INDEX ' ELSE 'INDEX ' END, INDEX_NAME,
  ' (', GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ', '), ')')`

// indexByName: MySQL index names belong to their table, so only the
// table's own indexes can take the name.
func (mysqlDialect) indexByName() string {
	return `SELECT 1, max(NON_UNIQUE) = 0, 1, ` + mysqlIndexDef + `
FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = $1 AND TABLE_NAME = $2 AND INDEX_NAME = $3
GROUP BY INDEX_NAME`
}

func (mysqlDialect) indexByNameArgs(ti *tableInfo, index string) []any {
	return []any{ti.schema, ti.name, index}
}

// uniqueOnKey: an index on the key alone, or on the key and the live
// column, fences it.
func (mysqlDialect) uniqueOnKey() string {
	return `SELECT INDEX_NAME, 1, ` + mysqlIndexDef + `
FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = $1 AND TABLE_NAME = $2 AND NON_UNIQUE = 0
GROUP BY INDEX_NAME
HAVING GROUP_CONCAT(COLUMN_NAME ORDER BY COLUMN_NAME SEPARATOR ',') IN ($3, $4)
ORDER BY INDEX_NAME`
}

func (mysqlDialect) uniqueOnKeyArgs(ti *tableInfo, names []string) []any {
	withLive := append(append([]string(nil), names...), liveColumn)
	sortStrings(withLive)
	return []any{ti.schema, ti.name, strings.Join(names, ","), strings.Join(withLive, ",")}
}

func (mysqlDialect) duplicate(err error) (string, bool) {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1062 {
		return me.Message, true
	}
	return "", false
}

// conflict: 1213 deadlock, 1205 lock wait timeout, 1020 a row changed
// since the snapshot read it (MariaDB's innodb_snapshot_isolation).
func (mysqlDialect) conflict(err error) bool {
	switch mysqlErrNumber(err) {
	case 1213, 1205, 1020:
		return true
	}
	return false
}

func (mysqlDialect) failedBuildLeavesIndex() bool { return false }
func (mysqlDialect) fencesNullStatus() bool       { return true }
func (mysqlDialect) ddlCommits() bool             { return true }
func (mysqlDialect) voidByID() bool               { return true }
