package idemtest

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// SnapshotOptions chooses what a database snapshotter reads. A nil
// *SnapshotOptions means all defaults.
type SnapshotOptions struct {
	// Schema is the PostgreSQL schema (the MySQL database) to read.
	// Defaults to the connection's current_schema(), the first schema of its
	// search_path (on MySQL, DATABASE()). Unused on SQLite.
	Schema string
	// Tables names the tables to read. Defaults to every table of the schema
	// (of the SQLite database) except those in Exclude.
	Tables []string
	// Exclude names tables to leave out. The inbox ("idem_inbox") and its
	// bookkeeping tables ("idem_migrations", "idem_inbox_settings",
	// "idem_inbox_horizons", "idem_inbox_pruned", "idem_inbox_positions",
	// "idem_consumer_pauses", "idem_consumer_pause_log") are always left out
	// unless named in Tables: a marker is written by every first delivery, so counting it
	// would make a consumer that does nothing look effective. Name a custom
	// inbox table here.
	Exclude []string
	// Ignore names columns to leave out of every comparison: "updated_at" in
	// every table, or "invoices.updated_at" in one. A primary key column is
	// never ignored: it names the row.
	Ignore []string
}

// inboxTables are left out of every snapshot unless asked for by name.
var inboxTables = []string{"idem_inbox", "idem_migrations", "idem_inbox_settings", "idem_inbox_horizons", "idem_inbox_pruned", "idem_inbox_positions",
	"idem_consumer_pauses", "idem_consumer_pause_log"}

// PgxQuerier is what the PostgreSQL snapshotter reads through: a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type PgxQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Postgres returns a snapshotter that reads PostgreSQL tables through pgx.
// Every column is read as its text form (::text), so any type compares.
func Postgres(db PgxQuerier, opts *SnapshotOptions) Snapshotter {
	return &dbSnapshotter{query: pgxQuery(db), catalog: pgCatalog, quote: quoteIdent, opts: optsOrZero(opts)}
}

// PostgresSQL is [Postgres] for a *sql.DB (the pgx stdlib driver or
// another PostgreSQL driver), as used with package sqlinbox.
func PostgresSQL(db *sql.DB, opts *SnapshotOptions) Snapshotter {
	return &dbSnapshotter{query: sqlQuery(db), catalog: pgCatalog, quote: quoteIdent, opts: optsOrZero(opts)}
}

// SQLite returns a snapshotter that reads the tables of a SQLite database
// (sqlite_master and pragma_table_info) through database/sql.
func SQLite(db *sql.DB, opts *SnapshotOptions) Snapshotter {
	return &dbSnapshotter{query: sqlQuery(db), catalog: sqliteCatalog, quote: quoteIdent, opts: optsOrZero(opts)}
}

// MySQL returns a snapshotter that reads the tables of a MySQL or MariaDB
// database (information_schema) through database/sql and
// github.com/go-sql-driver/mysql. Text, numbers, decimals and dates compare
// as the text MySQL sends; binary, blob and bit columns as hex (\x...).
// Views are left out. Rows of a table without a primary key are ordered
// by all their columns in the column's collation, which may compare
// "a" and "A" as equal: give such tables a key to diff them exactly.
func MySQL(db *sql.DB, opts *SnapshotOptions) Snapshotter {
	return &dbSnapshotter{query: mysqlQuery(db), catalog: mysqlCatalog, quote: quoteIdentMySQL, opts: optsOrZero(opts)}
}

func optsOrZero(o *SnapshotOptions) SnapshotOptions {
	if o == nil {
		return SnapshotOptions{}
	}
	return *o
}

// queryFunc runs a query and returns every row's values.
type queryFunc func(ctx context.Context, query string, args ...any) ([][]any, error)

// tableInfo describes one table: its columns in order and its primary key.
type tableInfo struct {
	name    string
	columns []string
	key     []string
}

// catalogFunc lists the tables of a database with their columns, and how
// to select one column as comparable text.
type catalogFunc func(ctx context.Context, q queryFunc, schema string) (tables []tableInfo, qualify string, asText func(quotedCol string) string, err error)

type dbSnapshotter struct {
	query   queryFunc
	catalog catalogFunc
	quote   func(string) string
	opts    SnapshotOptions
}

// Snapshot reads every chosen table, rows in primary-key order.
func (s *dbSnapshotter) Snapshot(ctx context.Context) (*Snapshot, error) {
	tables, prefix, asText, err := s.catalog(ctx, s.query, s.opts.Schema)
	if err != nil {
		return nil, fmt.Errorf("reading the catalog: %w", err)
	}
	snap := &Snapshot{}
	found := map[string]bool{}
	for _, ti := range tables {
		found[ti.name] = true
		if !s.chosen(ti.name) {
			continue
		}
		if err := s.read(ctx, snap, ti, prefix, asText); err != nil {
			return nil, err
		}
	}
	for _, name := range s.opts.Tables {
		if !found[name] {
			return nil, fmt.Errorf("snapshotting: table %s does not exist", name)
		}
	}
	return snap, nil
}

func (s *dbSnapshotter) chosen(table string) bool {
	if len(s.opts.Tables) > 0 {
		return slices.Contains(s.opts.Tables, table)
	}
	return !slices.Contains(s.opts.Exclude, table) && !slices.Contains(inboxTables, table)
}

func (s *dbSnapshotter) ignored(table, column string) bool {
	return slices.Contains(s.opts.Ignore, column) || slices.Contains(s.opts.Ignore, table+"."+column)
}

func (s *dbSnapshotter) read(ctx context.Context, snap *Snapshot, ti tableInfo, prefix string, asText func(string) string) error {
	var cols, exprs []string
	for _, c := range ti.columns {
		if s.ignored(ti.name, c) && !slices.Contains(ti.key, c) {
			continue
		}
		cols = append(cols, c)
		exprs = append(exprs, asText(s.quote(c)))
	}
	order := ti.key
	if len(order) == 0 {
		order = cols
	}
	orderBy := make([]string, len(order))
	for i, c := range order {
		orderBy[i] = s.quote(c)
	}
	from := prefix + s.quote(ti.name)
	q := "SELECT " + strings.Join(exprs, ", ") + " FROM " + from
	if len(orderBy) > 0 {
		q += " ORDER BY " + strings.Join(orderBy, ", ")
	}
	if len(exprs) == 0 {
		q = "SELECT 1 FROM " + from // a table whose every column is ignored still counts rows
	}
	rows, err := s.query(ctx, q)
	if err != nil {
		return fmt.Errorf("snapshotting table %s: %w", ti.name, err)
	}
	t := snap.AddTable(ti.name, cols, ti.key)
	for _, vals := range rows {
		row := Row{}
		for i, c := range cols {
			if v, ok := text(vals[i]); ok {
				row[c] = v
			}
		}
		t.Add(row)
	}
	return nil
}

// text renders a scanned value as text; ok is false for NULL. PostgreSQL
// values arrive as text already; SQLite's keep their storage class.
func text(v any) (string, bool) {
	switch v := v.(type) {
	case nil:
		return "", false
	case string:
		return v, true
	case []byte:
		return `\x` + hex.EncodeToString(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true
	case bool:
		return strconv.FormatBool(v), true
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano), true
	}
	return fmt.Sprint(v), true
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// quoteIdentMySQL quotes a name with backticks, doubling any inside, which
// is how MySQL escapes them whatever the sql_mode.
func quoteIdentMySQL(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

func pgxQuery(db PgxQuerier) queryFunc {
	return func(ctx context.Context, query string, args ...any) ([][]any, error) {
		rows, err := db.Query(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out [][]any
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return nil, err
			}
			out = append(out, vals)
		}
		return out, rows.Err()
	}
}

func sqlQuery(db *sql.DB) queryFunc {
	return func(ctx context.Context, query string, args ...any) ([][]any, error) {
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		cols, err := rows.Columns()
		if err != nil {
			return nil, err
		}
		var out [][]any
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				return nil, err
			}
			out = append(out, vals)
		}
		return out, rows.Err()
	}
}

// mysqlQuery is sqlQuery for MySQL's text protocol, which sends every value
// as bytes: those of character columns become strings, those of binary
// ones (BINARY, VARBINARY, the BLOBs, BIT, geometry) stay bytes and print
// as hex.
func mysqlQuery(db *sql.DB) queryFunc {
	return func(ctx context.Context, query string, args ...any) ([][]any, error) {
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		types, err := rows.ColumnTypes()
		if err != nil {
			return nil, err
		}
		binary := make([]bool, len(types))
		for i, t := range types {
			switch t.DatabaseTypeName() {
			case "BINARY", "VARBINARY", "BLOB", "TINYBLOB", "MEDIUMBLOB", "LONGBLOB", "BIT", "GEOMETRY":
				binary[i] = true
			}
		}
		var out [][]any
		for rows.Next() {
			vals := make([]any, len(types))
			ptrs := make([]any, len(types))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				return nil, err
			}
			for i, v := range vals {
				if b, ok := v.([]byte); ok && !binary[i] {
					vals[i] = string(b)
				}
			}
			out = append(out, vals)
		}
		return out, rows.Err()
	}
}

// mysqlCatalog lists the base tables of a MySQL database (schema, or the
// connection's current one) with their columns in order and their primary
// key.
func mysqlCatalog(ctx context.Context, q queryFunc, schema string) ([]tableInfo, string, func(string) string, error) {
	rows, err := q(ctx, `SELECT coalesce(nullif(?, ''), DATABASE())`, schema)
	if err != nil {
		return nil, "", nil, err
	}
	if len(rows) != 1 || rows[0][0] == nil {
		return nil, "", nil, fmt.Errorf("no current database: set SnapshotOptions.Schema or name one in the DSN")
	}
	schema, _ = text(rows[0][0])
	rows, err = q(ctx, `
SELECT c.TABLE_NAME, c.COLUMN_NAME, CAST(coalesce(k.ORDINAL_POSITION, 0) AS CHAR)
FROM information_schema.COLUMNS c
JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME
LEFT JOIN information_schema.KEY_COLUMN_USAGE k ON k.TABLE_SCHEMA = c.TABLE_SCHEMA AND k.TABLE_NAME = c.TABLE_NAME
  AND k.COLUMN_NAME = c.COLUMN_NAME AND k.CONSTRAINT_NAME = 'PRIMARY'
WHERE c.TABLE_SCHEMA = ? AND t.TABLE_TYPE = 'BASE TABLE'
ORDER BY BINARY c.TABLE_NAME, c.ORDINAL_POSITION`, schema)
	if err != nil {
		return nil, "", nil, err
	}
	tables, err := collect(rows)
	return tables, quoteIdentMySQL(schema) + ".", func(col string) string { return col }, err
}

// pgCatalog lists the tables of schema (partitioned tables once, through
// their parent) with their columns in order and their primary key.
func pgCatalog(ctx context.Context, q queryFunc, schema string) ([]tableInfo, string, func(string) string, error) {
	rows, err := q(ctx, `SELECT coalesce(nullif($1::text, ''), current_schema())::text`, schema)
	if err != nil {
		return nil, "", nil, err
	}
	if len(rows) != 1 || rows[0][0] == nil {
		return nil, "", nil, fmt.Errorf("no current schema: set SnapshotOptions.Schema or the search_path")
	}
	schema, _ = text(rows[0][0])
	rows, err = q(ctx, `
SELECT c.relname::text, a.attname::text,
       -- indkey is an int2vector, indexed from 0: rebase positions to 1.
       coalesce(array_position(i.indkey::int2[], a.attnum) + 1 - array_lower(i.indkey::int2[], 1), 0)::text
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname, a.attnum`, schema)
	if err != nil {
		return nil, "", nil, err
	}
	tables, err := collect(rows)
	asText := func(col string) string { return col + "::text" }
	return tables, quoteIdent(schema) + ".", asText, err
}

// sqliteCatalog lists the tables of the main SQLite database.
func sqliteCatalog(ctx context.Context, q queryFunc, _ string) ([]tableInfo, string, func(string) string, error) {
	rows, err := q(ctx, `
SELECT m.name, p.name, p.pk
FROM sqlite_master m, pragma_table_info(m.name) p
WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite\_%' ESCAPE '\'
ORDER BY m.name, p.cid`)
	if err != nil {
		return nil, "", nil, err
	}
	tables, err := collect(rows)
	return tables, "", func(col string) string { return col }, err
}

// collect folds (table, column, key position) rows into tables.
func collect(rows [][]any) ([]tableInfo, error) {
	var out []tableInfo
	type keyCol struct {
		pos  int
		name string
	}
	var keys []keyCol
	flush := func() {
		if len(out) == 0 {
			return
		}
		slices.SortFunc(keys, func(a, b keyCol) int { return a.pos - b.pos })
		for _, k := range keys {
			out[len(out)-1].key = append(out[len(out)-1].key, k.name)
		}
		keys = nil
	}
	for _, r := range rows {
		table, _ := text(r[0])
		col, _ := text(r[1])
		p, _ := text(r[2])
		pos, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("key position of %s.%s: %w", table, col, err)
		}
		if len(out) == 0 || out[len(out)-1].name != table {
			flush()
			out = append(out, tableInfo{name: table})
		}
		out[len(out)-1].columns = append(out[len(out)-1].columns, col)
		if pos > 0 {
			keys = append(keys, keyCol{pos, col})
		}
	}
	flush()
	return out, nil
}
