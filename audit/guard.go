package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrViolations is returned by [Auditor.Guard] when live rows still share a
// key: the unique index cannot be built until they are voided.
var ErrViolations = errors.New("duplicate groups remain among live rows")

// ErrIndexNameTaken is returned by [Auditor.Guard] when an index of the
// chosen name exists but is not a unique index on the audited table.
var ErrIndexNameTaken = errors.New("index name taken")

// IndexName returns the guard index name used when none is given:
// ux_<table>_<key columns>, cut to 63 bytes.
func (a *Auditor) IndexName() string {
	n := "ux_" + a.p.table.Name() + "_" + strings.Join(a.p.keyNames(), "_")
	if len(n) > maxIdentLen {
		n = n[:maxIdentLen]
	}
	return n
}

func (a *Auditor) index(name string) (Ident, error) {
	if name == "" {
		name = a.IndexName()
	}
	id, err := ParseIdent(name, false)
	if err != nil {
		return nil, fmt.Errorf("index (an index always lives in its table's schema; give a plain name): %w", err)
	}
	return id, nil
}

// GuardDDL returns the statement [Auditor.Guard] runs, for a migration or a
// DBA: a partial unique index on the key over every row whose status is not
// the void value, or on a table without a status column ([NoColumn]) a
// plain unique index on the key. index may be empty for [Auditor.IndexName].
func (a *Auditor) GuardDDL(index string) (string, error) {
	id, err := a.index(index)
	if err != nil {
		return "", err
	}
	return a.d.guardDDL(a.p, id) + ";", nil
}

// GuardResult reports what [Auditor.Guard] did.
type GuardResult struct {
	Table string `json:"table"`
	Index string `json:"index"`
	DDL   string `json:"ddl"`
	// Created is true when this call built the index; Existing is set when a
	// valid unique index of that name was already there (nothing to do).
	Created  bool   `json:"created"`
	Existing string `json:"existing,omitempty"`
	// DroppedInvalid is set when a failed earlier build had left an invalid
	// index of that name, which was dropped before building again.
	DroppedInvalid bool `json:"dropped_invalid,omitempty"`
	// Groups and ExtraRows are the live duplicates found by the pre-check.
	Groups    int64 `json:"groups"`
	ExtraRows int64 `json:"extra_rows"`
	// Warnings are facts that weaken the fence without stopping it.
	Warnings []string `json:"warnings,omitempty"`
	Elapsed  string   `json:"elapsed"`
}

// Guard builds the partial unique index (plain, without a status column)
// that fences the table for good,
// with CREATE UNIQUE INDEX CONCURRENTLY so writers are not blocked. It
// first checks that no live rows share a key (else [ErrViolations]: run
// [Auditor.Void] first). It is idempotent: a valid index of that name is
// left alone. If the build fails (duplicates written meanwhile), the invalid
// index PostgreSQL leaves behind is dropped and the error returned.
//
// A concurrent build waits for every transaction in the database that is
// older than it, whatever table it touches: on a busy database it takes as
// long as the longest of them, and a session left idle in a transaction
// holds it until that session ends.
func (a *Auditor) Guard(ctx context.Context, index string) (*GuardResult, error) {
	start := time.Now()
	id, err := a.index(index)
	if err != nil {
		return nil, err
	}
	res := &GuardResult{Table: a.p.table.String(), Index: id.Name(), DDL: a.d.guardDDL(a.p, id) + ";"}
	ti, err := a.inspect(ctx, a.db, false)
	if err != nil {
		return nil, err
	}
	var onTable, unique, valid bool
	var def string
	err = a.db.queryRow(ctx, a.d.indexByName(), a.d.indexByNameArgs(ti, id.Name())...).Scan(&onTable, &unique, &valid, &def)
	switch {
	case errors.Is(err, errNoRows):
	case err != nil:
		return nil, fmt.Errorf("looking up index %s: %w", id, err)
	case !onTable || !unique:
		return nil, fmt.Errorf("%w: %s.%s exists and is not a unique index on %s (%s); choose another with --index", ErrIndexNameTaken, ti.schema, id, a.p.table, def)
	case valid:
		idx, err := a.keyIndexes(ctx, ti)
		if err != nil {
			return nil, err
		}
		onKey := false
		for _, ix := range idx {
			onKey = onKey || ix.name == id.Name()
		}
		if !onKey {
			return nil, fmt.Errorf("%w: %s.%s is a unique index on other columns (%s); choose another with --index", ErrIndexNameTaken, ti.schema, id, def)
		}
		res.Existing = def
		res.Elapsed = time.Since(start).Round(time.Millisecond).String()
		return res, nil
	default:
		if _, err := a.db.exec(ctx, a.d.dropIndex(a.p, ti.schema, id)); err != nil {
			return nil, fmt.Errorf("dropping invalid index %s left by an earlier build: %w", id, err)
		}
		res.DroppedInvalid = true
	}
	if res.Groups, res.ExtraRows, err = a.count(ctx, a.db); err != nil {
		return nil, err
	}
	if res.Groups > 0 {
		return res, fmt.Errorf("%w: %d groups, %d extra rows in %s; void them first (idem audit void)", ErrViolations, res.Groups, res.ExtraRows, a.p.table)
	}
	if c, ok := ti.cols[nameOf(a.p.status)]; ok && !c.notNull && !a.d.fencesNullStatus() {
		res.Warnings = append(res.Warnings, fmt.Sprintf("column %s is nullable: rows whose status is NULL are outside the index predicate and not fenced; make it NOT NULL", a.p.status))
	}
	stmts, err := a.d.guardStatements(a.p, id, ti)
	if err != nil {
		return res, err
	}
	if err := a.db.session(ctx, func(c conn) error {
		for _, q := range stmts {
			if _, err := c.exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		buildErr := fmt.Errorf("building index %s: %w", id, err)
		if detail, ok := a.d.duplicate(err); ok {
			buildErr = fmt.Errorf("%w: a duplicate was written while the index was being built (%s): %w", ErrViolations, detail, err)
		}
		if !a.d.failedBuildLeavesIndex() {
			return res, buildErr
		}
		// A failed concurrent build leaves an INVALID index that still slows
		// writes and blocks the name; remove it.
		if _, derr := a.db.exec(context.WithoutCancel(ctx), a.d.dropIndex(a.p, ti.schema, id)); derr != nil {
			return res, errors.Join(buildErr, fmt.Errorf("dropping the invalid index: %w", derr))
		}
		return res, buildErr
	}
	res.Created = true
	res.Elapsed = time.Since(start).Round(time.Millisecond).String()
	return res, nil
}

func (a *Auditor) count(ctx context.Context, q conn) (groups, extra int64, err error) {
	if err := q.queryRow(ctx, a.d.check(a.p), a.p.spec.VoidValue).Scan(&groups, &extra); err != nil {
		return 0, 0, fmt.Errorf("counting duplicate groups in %s: %w", a.p.table, err)
	}
	return groups, extra, nil
}
