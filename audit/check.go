package audit

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// CheckResult is one integrity check: how many keys are held by more than
// one live row. Once the guard index exists it must be zero; a non-zero
// value means the index was dropped or bypassed.
type CheckResult struct {
	Table      string    `json:"table"`
	KeyColumns []string  `json:"key_columns"`
	Groups     int64     `json:"groups"`
	ExtraRows  int64     `json:"extra_rows"`
	CheckedAt  time.Time `json:"checked_at"`
	// GuardIndex names a valid unique index on exactly the key columns, ""
	// when there is none (whatever its name: a constraint added by a
	// migration counts too).
	GuardIndex string `json:"guard_index"`
	GuardDDL   string `json:"guard_index_definition,omitempty"`
}

// Check counts duplicate groups among live rows and looks for the index
// that should make that count impossible.
func (a *Auditor) Check(ctx context.Context) (*CheckResult, error) {
	ti, err := a.inspect(ctx, a.db, false)
	if err != nil {
		return nil, err
	}
	res := &CheckResult{Table: a.p.table.String(), KeyColumns: a.p.keyNames(), CheckedAt: time.Now().UTC()}
	if res.Groups, res.ExtraRows, err = a.count(ctx, a.db); err != nil {
		return nil, err
	}
	idx, err := a.keyIndexes(ctx, ti)
	if err != nil {
		return nil, err
	}
	for _, ix := range idx {
		if ix.valid {
			res.GuardIndex, res.GuardDDL = ix.name, ix.def
			break
		}
	}
	return res, nil
}

// Watch runs [Auditor.Check] now and then every interval until ctx ends,
// handing each result (or error) to report. It returns nil when ctx ends.
func (a *Auditor) Watch(ctx context.Context, every time.Duration, report func(*CheckResult, error)) error {
	if every <= 0 {
		return fmt.Errorf("%w: watch interval %v must be positive", ErrInvalidSpec, every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		res, err := a.Check(ctx)
		if ctx.Err() != nil {
			return nil
		}
		report(res, err)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

type indexInfo struct {
	name  string
	valid bool
	def   string
}

// keyIndexes lists the unique indexes on exactly the key columns, valid
// ones first.
func (a *Auditor) keyIndexes(ctx context.Context, ti *tableInfo) ([]indexInfo, error) {
	names := a.p.keyNames()
	sort.Strings(names)
	rows, err := a.db.query(ctx, a.d.uniqueOnKey(), a.d.uniqueOnKeyArgs(ti, names)...)
	if err != nil {
		return nil, fmt.Errorf("looking for a unique index on %s: %w", a.p.table, err)
	}
	defer rows.Close()
	var out []indexInfo
	for rows.Next() {
		var ix indexInfo
		if err := rows.Scan(&ix.name, &ix.valid, &ix.def); err != nil {
			return nil, fmt.Errorf("looking for a unique index on %s: %w", a.p.table, err)
		}
		out = append(out, ix)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("looking for a unique index on %s: %w", a.p.table, err)
	}
	return out, nil
}
