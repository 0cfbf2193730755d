package audit

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what an [Auditor] needs from PostgreSQL; *pgxpool.Pool and
// *pgx.Conn satisfy it.
type DB interface {
	querier
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotFound is wrapped when the table or one of the named columns does
// not exist.
var ErrNotFound = errors.New("not found")

// Auditor audits one business table for duplicate rows: it reports them
// ([Auditor.Duplicates]), voids the extras ([Auditor.Void]), fences the table
// with a partial unique index ([Auditor.Guard]) and watches that nothing gets
// past it ([Auditor.Check]).
type Auditor struct {
	db backend
	p  *plan
	d  dialect
}

// New validates spec (see [Spec] for defaults) and returns an Auditor on
// db. It touches no database; a table or column that does not exist is
// reported by the first operation.
func New(db DB, spec Spec) (*Auditor, error) {
	p, err := compile(spec)
	if err != nil {
		return nil, err
	}
	return &Auditor{db: pgBackend{db}, p: p, d: postgres{}}, nil
}

// Spec returns the spec with defaults applied.
func (a *Auditor) Spec() Spec { return a.p.spec }

// tableInfo is what the catalog says about the audited table.
type tableInfo struct {
	oid       uint32
	schemaOID uint32
	schema    string
	name      string
	cols      map[string]column
}

type column struct {
	typ     string
	notNull bool
}

// inspect reads the table from the catalog and checks that every column
// the operation reads exists, so that a typo fails with its name rather
// than with a SQL error. rows is set for the operations that rank rows (id,
// time and amount); counting needs only the key and the status.
func (a *Auditor) inspect(ctx context.Context, q conn, rows bool) (*tableInfo, error) {
	var ti tableInfo
	var kind string
	err := q.queryRow(ctx, a.d.table(), a.d.tableArgs(a.p)...).Scan(&ti.oid, &ti.schemaOID, &ti.schema, &ti.name, &kind)
	if errors.Is(err, errNoRows) {
		hint := ""
		if strings.ToLower(a.p.table.String()) != a.p.table.String() {
			hint = " (names are matched exactly as written: try lower case)"
		}
		return nil, fmt.Errorf("table %s: %w%s", a.p.table, ErrNotFound, hint)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up table %s: %w", a.p.table, err)
	}
	if kind != "r" && kind != "p" {
		return nil, fmt.Errorf("%s is not a table (relkind %s)", a.p.table, kind)
	}
	cr, err := q.query(ctx, a.d.columns(), a.d.columnsArgs(&ti)...)
	if err != nil {
		return nil, fmt.Errorf("listing columns of %s: %w", a.p.table, err)
	}
	ti.cols = map[string]column{}
	for cr.Next() {
		var name string
		var c column
		if err := cr.Scan(&name, &c.typ, &c.notNull); err != nil {
			return nil, fmt.Errorf("listing columns of %s: %w", a.p.table, err)
		}
		ti.cols[name] = c
	}
	if err := cr.Err(); err != nil {
		return nil, fmt.Errorf("listing columns of %s: %w", a.p.table, err)
	}
	cr.Close()
	need := append([]Ident(nil), a.p.key...)
	if a.p.status != nil {
		need = append(need, a.p.status)
	}
	if rows {
		if a.p.id != nil {
			need = append(need, a.p.id)
		}
		need = append(need, a.p.time)
		if a.p.amount != nil {
			need = append(need, a.p.amount)
		}
	}
	var missing []string
	for _, c := range need {
		if _, ok := ti.cols[c.Name()]; !ok {
			missing = append(missing, c.Name())
		}
	}
	if len(missing) > 0 {
		have := make([]string, 0, len(ti.cols))
		for n := range ti.cols {
			have = append(have, n)
		}
		sort.Strings(have)
		return nil, fmt.Errorf("table %s has no column %s: %w (it has %s)", a.p.table, strings.Join(missing, ", "), ErrNotFound, strings.Join(have, ", "))
	}
	return &ti, nil
}

// missingAuditColumns returns the reason/actor/voided-at columns the table
// lacks.
func (a *Auditor) missingAuditColumns(ti *tableInfo) []Ident {
	var out []Ident
	cols := []Ident{a.p.reason, a.p.actor, a.p.voidedAt}
	if a.p.prev != nil {
		cols = append(cols, a.p.prev)
	}
	for _, c := range cols {
		if _, ok := ti.cols[c.Name()]; !ok {
			out = append(out, c)
		}
	}
	return out
}

func identNames(ids []Ident) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.Name()
	}
	return out
}
