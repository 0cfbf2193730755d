package idemtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Snapshotter reads the state a consumer may change. The kit compares
// snapshots taken before and after each delivery, so a change nobody thought
// to assert on still shows.
type Snapshotter interface {
	Snapshot(ctx context.Context) (*Snapshot, error)
}

// SnapshotFunc adapts a function to [Snapshotter], for state outside the
// database (a fake mailer's sent list) or a hand-picked query.
type SnapshotFunc func(ctx context.Context) (*Snapshot, error)

// Snapshot calls f.
func (f SnapshotFunc) Snapshot(ctx context.Context) (*Snapshot, error) { return f(ctx) }

// Combine returns a snapshotter that merges what each of ss sees, for a
// consumer whose effects span the database and something else. Table names
// must not repeat across ss.
func Combine(ss ...Snapshotter) Snapshotter {
	return SnapshotFunc(func(ctx context.Context) (*Snapshot, error) {
		out := &Snapshot{}
		for _, s := range ss {
			part, err := s.Snapshot(ctx)
			if err != nil {
				return nil, err
			}
			for _, name := range part.TableNames() {
				if out.Table(name) != nil {
					return nil, fmt.Errorf("combining snapshots: table %s is seen twice", name)
				}
				out.tables = append(out.tables, part.Table(name))
			}
		}
		return out, nil
	})
}

// Snapshot is the state of some tables at one moment: each table's rows,
// keyed by primary key, with every compared column's value as text.
type Snapshot struct {
	tables []*Table
}

// Table is one table of a [Snapshot].
type Table struct {
	// Name is the table's name.
	Name string
	// Columns are the compared columns, in table order (ignored columns are
	// left out).
	Columns []string
	// Key lists the primary key's columns. When empty, a row is keyed by its
	// whole content, and identical rows by their count ("… #2").
	Key  []string
	rows map[string]Row
	keys []string // in primary-key order
}

// Row is one row: column name → value as text. A NULL is absent from the
// map, so that it never equals the text "NULL" or "".
type Row map[string]string

// AddTable adds an empty table to s and returns it, for a [SnapshotFunc]
// that builds its own snapshot. key may be empty: see [Table.Key].
func (s *Snapshot) AddTable(name string, columns, key []string) *Table {
	t := &Table{Name: name, Columns: columns, Key: key, rows: map[string]Row{}}
	s.tables = append(s.tables, t)
	return t
}

// Table returns the table named name, or nil.
func (s *Snapshot) Table(name string) *Table {
	for _, t := range s.tables {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// TableNames returns the names of the tables in s, in the order they were
// read.
func (s *Snapshot) TableNames() []string {
	names := make([]string, len(s.tables))
	for i, t := range s.tables {
		names[i] = t.Name
	}
	return names
}

// Add appends a row. Its key is built from the table's key columns, or from
// the whole row when the table has none.
func (t *Table) Add(row Row) {
	cols := t.Key
	if len(cols) == 0 {
		cols = t.Columns
	}
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = c + "=" + show(row, c)
	}
	key := strings.Join(parts, ", ")
	if len(t.Key) == 0 {
		// Identical rows of a keyless table are told apart by their count,
		// so a second copy shows as an added row.
		base := key
		for n := 2; t.rows[key] != nil; n++ {
			key = fmt.Sprintf("%s #%d", base, n)
		}
	}
	t.rows[key] = row
	t.keys = append(t.keys, key)
}

// Len returns the number of rows.
func (t *Table) Len() int { return len(t.keys) }

// Row returns the row whose key is key ("id=42", or "customer=c1,
// period=2026-03" for a composite key), or nil.
func (t *Table) Row(key string) Row { return t.rows[key] }

// RowKeys returns the rows' keys in primary-key order.
func (t *Table) RowKeys() []string { return slices.Clone(t.keys) }

// show renders a column's value for people: NULL for a NULL, quotes only
// where a bare value would be ambiguous.
func show(row Row, col string) string {
	v, ok := row[col]
	if !ok {
		return "NULL"
	}
	if v == "" || v == "NULL" || strings.TrimSpace(v) != v || strings.ContainsAny(v, ",=\n\"") {
		return fmt.Sprintf("%q", v)
	}
	return v
}
