package idemtest

import (
	"fmt"
	"slices"
	"strings"
)

// Diff is what changed between two snapshots, table by table.
type Diff struct {
	Tables []TableDiff
}

// TableDiff is what changed in one table.
type TableDiff struct {
	Table   string
	Added   []RowChange
	Removed []RowChange
	Changed []RowChange
}

// RowChange is one row added, removed or changed.
type RowChange struct {
	// Key identifies the row: "id=42", or the whole row for a keyless table.
	Key string
	// Row is the row as it is after the change (before, for a removed row).
	Row Row
	// Columns lists, for a changed row, each column whose value changed.
	Columns []ColumnChange
	order   []string // the table's columns, for printing the row
}

// ColumnChange is one column's value before and after, as text ("NULL" for
// a NULL).
type ColumnChange struct {
	Column, Before, After string
}

// Compare returns what changed from before to after. A table present in
// only one snapshot counts as empty in the other.
func Compare(before, after *Snapshot) Diff {
	var d Diff
	names := before.TableNames()
	for _, n := range after.TableNames() {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	for _, name := range names {
		tb, ta := before.Table(name), after.Table(name)
		if tb == nil {
			tb = &Table{Name: name}
		}
		if ta == nil {
			ta = &Table{Name: name}
		}
		td := TableDiff{Table: name}
		columns := ta.Columns
		if len(columns) == 0 {
			columns = tb.Columns
		}
		for _, k := range tb.keys {
			rb, ra := tb.rows[k], ta.rows[k]
			if ra == nil {
				td.Removed = append(td.Removed, RowChange{Key: k, Row: rb, order: columns})
				continue
			}
			var cc []ColumnChange
			for _, c := range columns {
				vb, okb := rb[c]
				va, oka := ra[c]
				if vb != va || okb != oka {
					cc = append(cc, ColumnChange{Column: c, Before: show(rb, c), After: show(ra, c)})
				}
			}
			if len(cc) > 0 {
				td.Changed = append(td.Changed, RowChange{Key: k, Row: ra, Columns: cc})
			}
		}
		for _, k := range ta.keys {
			if tb.rows[k] == nil {
				td.Added = append(td.Added, RowChange{Key: k, Row: ta.rows[k], order: columns})
			}
		}
		if td.Len() > 0 {
			d.Tables = append(d.Tables, td)
		}
	}
	return d
}

// Empty reports whether nothing changed.
func (d Diff) Empty() bool { return len(d.Tables) == 0 }

// Len returns the number of rows added, removed or changed: a rough measure
// of damage.
func (d Diff) Len() int {
	n := 0
	for _, t := range d.Tables {
		n += t.Len()
	}
	return n
}

// Len returns the number of rows added, removed or changed in the table.
func (t TableDiff) Len() int { return len(t.Added) + len(t.Removed) + len(t.Changed) }

// TableNames returns the names of the tables that changed.
func (d Diff) TableNames() []string {
	names := make([]string, len(d.Tables))
	for i, t := range d.Tables {
		names[i] = t.Table
	}
	return names
}

// Summary is a one-line account per table: "invoices +1 row;
// balances.balance changed in 1 row".
func (d Diff) Summary() string {
	var parts []string
	for _, t := range d.Tables {
		if n := len(t.Added); n > 0 {
			parts = append(parts, fmt.Sprintf("%s +%s", t.Table, rows(n)))
		}
		if n := len(t.Removed); n > 0 {
			parts = append(parts, fmt.Sprintf("%s -%s", t.Table, rows(n)))
		}
		if len(t.Changed) > 0 {
			count := map[string]int{}
			var cols []string
			for _, r := range t.Changed {
				for _, c := range r.Columns {
					if count[c.Column] == 0 {
						cols = append(cols, c.Column)
					}
					count[c.Column]++
				}
			}
			for _, c := range cols {
				parts = append(parts, fmt.Sprintf("%s.%s changed in %s", t.Table, c, rows(count[c])))
			}
		}
	}
	return strings.Join(parts, "; ")
}

// String lists every change, one row per line, each naming the table, the
// row and the columns with their values before → after.
func (d Diff) String() string {
	if d.Empty() {
		return "no change"
	}
	var b strings.Builder
	for _, t := range d.Tables {
		for _, r := range t.Changed {
			fmt.Fprintf(&b, "  %s row %s changed:", t.Table, r.Key)
			for i, c := range r.Columns {
				sep := ","
				if i == 0 {
					sep = ""
				}
				fmt.Fprintf(&b, "%s %s %s → %s", sep, c.Column, c.Before, c.After)
			}
			b.WriteByte('\n')
		}
		for _, r := range t.Added {
			fmt.Fprintf(&b, "  %s row added: %s\n", t.Table, rowText(r))
		}
		for _, r := range t.Removed {
			fmt.Fprintf(&b, "  %s row removed: %s\n", t.Table, rowText(r))
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// rowText renders a row's columns in table order, or in name order for a
// change built by hand.
func rowText(r RowChange) string {
	cols := r.order
	if cols == nil {
		for c := range r.Row {
			cols = append(cols, c)
		}
		slices.Sort(cols)
	}
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = c + "=" + show(r.Row, c)
	}
	return strings.Join(parts, ", ")
}

func rows(n int) string {
	if n == 1 {
		return "1 row"
	}
	return fmt.Sprintf("%d rows", n)
}
