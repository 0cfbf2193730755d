package audit

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strings"
	"time"
)

// ErrStillBeingCreated is returned by [Auditor.Void] when there is something
// to void but duplicates are still being created (see [Activity]): voiding
// now is work the producer will undo. [VoidOptions.Force] overrides it.
var ErrStillBeingCreated = errors.New("duplicates are still being created")

// ErrMissingColumns is returned by [Auditor.Void] when the table lacks the
// reason, actor or voided-at column and [VoidOptions.AddColumns] is not set:
// set it, or name existing columns in the [Spec].
var ErrMissingColumns = errors.New("audit columns missing")

// ErrConcurrentChange is returned by [Auditor.Void] when rows it was about
// to void changed under it; nothing was written, and running again is safe.
var ErrConcurrentChange = errors.New("the table changed during the void")

// VoidOptions configures [Auditor.Void].
type VoidOptions struct {
	// Apply writes; without it Void is a dry run in a read-only transaction
	// and reports what it would do.
	Apply bool
	// Reason and Actor are written to every voided row. Required with Apply.
	Reason string
	Actor  string
	// IncludePaid voids paid extra rows too. Leave it off until their
	// refunds are done: a voided row must still be there to reconcile the
	// refund against, which is why nothing is ever deleted.
	IncludePaid bool
	// Force voids even when duplicates are still being created.
	Force bool
	// AddColumns adds the missing audit columns (nullable text for reason,
	// actor and previous status, timestamptz for the time) in the same
	// transaction.
	AddColumns bool
	// LockTimeout bounds every lock wait of the transaction, so a void never
	// queues behind a long query while blocking the table's writers.
	// Defaults to 10s; -1 leaves the server's setting.
	LockTimeout time.Duration
}

// VoidResult reports what [Auditor.Void] did or, on a dry run, would do.
type VoidResult struct {
	Table      string   `json:"table"`
	KeyColumns []string `json:"key_columns"`
	// Applied is true when the transaction committed.
	Applied bool `json:"applied"`
	// Groups is the number of duplicate groups before the void; in each, the
	// earliest live row is kept.
	Groups int64 `json:"groups"`
	// Voided lists the rows voided (or, on a dry run, to be voided), and
	// VoidedAmount totals them.
	Voided       []Row   `json:"voided"`
	VoidedAmount *string `json:"voided_amount,omitempty"`
	// Refund lists paid extra rows that were skipped: refund them, then
	// void them with IncludePaid. With IncludePaid it lists the paid rows
	// that were voided, as a reminder that each needs its refund.
	Refund       []Row   `json:"refund"`
	RefundAmount *string `json:"refund_amount,omitempty"`
	// AddedColumns are the audit columns added (or, on a dry run, to add).
	AddedColumns []string `json:"added_columns,omitempty"`
	Activity     Activity `json:"activity"`
	Forced       bool     `json:"forced,omitempty"`
}

// Void marks every live row but the earliest of each duplicate group as
// voided: the status column gets the void value and the reason, actor,
// voided-at and previous-status columns are written. Paid rows are skipped and listed for
// refund unless IncludePaid is set. It never deletes. It needs a status
// and an id column: with [NoColumn] for either it refuses with an error
// wrapping [ErrInvalidSpec].
//
// Everything happens in one REPEATABLE READ transaction: the rows listed
// are exactly the rows updated, and a concurrent change to one of them
// fails the void with [ErrConcurrentChange] instead of voiding on stale
// facts. Running it again once done changes nothing: voided rows are no
// longer live, so no group is left with extras.
func (a *Auditor) Void(ctx context.Context, opt VoidOptions) (*VoidResult, error) {
	if err := a.checkVoid(opt); err != nil {
		return nil, err
	}
	if opt.LockTimeout == 0 {
		opt.LockTimeout = 10 * time.Second
	}
	added, err := a.addColumnsFirst(ctx, opt)
	if err != nil {
		return nil, err
	}
	tx, err := a.beginVoid(ctx, opt)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.rollback(context.WithoutCancel(ctx)) }()
	res := &VoidResult{Table: a.p.table.String(), KeyColumns: a.p.keyNames(), Forced: opt.Force, AddedColumns: added}
	if err := a.voidColumns(ctx, tx, opt, res); err != nil {
		return nil, err
	}
	if err := a.listVoid(ctx, tx, opt, res); err != nil {
		return nil, err
	}
	if len(res.Voided) > 0 && res.Activity.StillBeingCreated && !opt.Force {
		return res, fmt.Errorf("%w: the newest duplicate row is %s old, inside the quiet period of %s; refusing to void %d rows: stop the producer and wait out the quiet period",
			ErrStillBeingCreated, roundAge(res.Activity.Age()), res.Activity.QuietPeriod, len(res.Voided))
	}
	if !opt.Apply {
		return res, nil
	}
	if len(res.Voided) > 0 {
		if err := a.update(ctx, tx, opt, res.Voided); err != nil {
			return nil, err
		}
	}
	if err := tx.commit(ctx); err != nil {
		return nil, a.classifyVoidErr(fmt.Errorf("committing void: %w", err))
	}
	res.Applied = true
	return res, nil
}

// checkVoid refuses, wrapping [ErrInvalidSpec], a void the spec cannot
// carry out (no status or id column) and one that writes without a reason
// and an actor.
func (a *Auditor) checkVoid(opt VoidOptions) error {
	if a.p.status == nil {
		return fmt.Errorf("%w: voiding marks rows by their status column, and the spec names none", ErrInvalidSpec)
	}
	if a.p.id == nil {
		return fmt.Errorf("%w: voiding names every row it voids by its id column, and the spec names none", ErrInvalidSpec)
	}
	if opt.Apply && (strings.TrimSpace(opt.Reason) == "" || strings.TrimSpace(opt.Actor) == "") {
		return fmt.Errorf("%w: a void that writes needs a reason and an actor (who is voiding)", ErrInvalidSpec)
	}
	return nil
}

// addColumnsFirst adds the missing audit columns before the void's
// transaction, on an engine where DDL would commit that transaction
// half-way, and returns the names it added. The columns stay if the void
// then fails; they are nullable and a later void uses them. Elsewhere it
// adds nothing: the void's transaction adds them.
func (a *Auditor) addColumnsFirst(ctx context.Context, opt VoidOptions) ([]string, error) {
	if !opt.Apply || !opt.AddColumns || !a.d.ddlCommits() {
		return nil, nil
	}
	ti, err := a.inspect(ctx, a.db, true)
	if err != nil {
		return nil, err
	}
	missing := a.missingAuditColumns(ti)
	if len(missing) == 0 {
		return nil, nil
	}
	if _, err := a.db.exec(ctx, a.d.addColumns(a.p, missing)); err != nil {
		return nil, fmt.Errorf("adding audit columns to %s: %w", a.p.table, err)
	}
	return identNames(missing), nil
}

// beginVoid begins the void's transaction, read-only for a dry run, with
// every lock wait bounded by opt.LockTimeout (unless negative).
func (a *Auditor) beginVoid(ctx context.Context, opt VoidOptions) (txConn, error) {
	mode := readOnly
	if opt.Apply {
		mode = readWrite
	}
	t, err := a.db.begin(ctx, mode)
	if err != nil {
		return nil, fmt.Errorf("beginning void transaction: %w", err)
	}
	if opt.LockTimeout > 0 {
		if _, err := t.exec(ctx, a.d.setLockTimeout(), a.d.lockTimeoutArg(opt.LockTimeout)); err != nil {
			_ = t.rollback(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("setting lock timeout: %w", err)
		}
	}
	return t, nil
}

// voidColumns checks, inside the transaction, that the audit columns are
// there: missing ones are refused with [ErrMissingColumns] unless
// opt.AddColumns, which reports them in res and, with opt.Apply, adds
// them in the transaction.
func (a *Auditor) voidColumns(ctx context.Context, t txConn, opt VoidOptions, res *VoidResult) error {
	ti, err := a.inspect(ctx, t, true)
	if err != nil {
		return err
	}
	missing := a.missingAuditColumns(ti)
	if len(missing) == 0 {
		return nil
	}
	if !opt.AddColumns {
		return fmt.Errorf("%w: table %s has no column %s",
			ErrMissingColumns, a.p.table, strings.Join(identNames(missing), ", "))
	}
	res.AddedColumns = identNames(missing)
	if opt.Apply {
		if _, err := t.exec(ctx, a.d.addColumns(a.p, missing)); err != nil {
			return fmt.Errorf("adding audit columns to %s: %w", a.p.table, err)
		}
	}
	return nil
}

// listVoid fills res with the duplicate groups, the activity, the rows to
// void (the unpaid extras, and the paid ones with opt.IncludePaid), the
// paid extras to refund, and their totals, all read in the transaction's
// one snapshot.
func (a *Auditor) listVoid(ctx context.Context, t txConn, opt VoidOptions, res *VoidResult) error {
	// Reads lock on an engine that voids at SERIALIZABLE: a lock wait or
	// deadlock there is a concurrent change too.
	sum, err := a.summary(ctx, t)
	if err != nil {
		return a.classifyVoidErr(err)
	}
	res.Groups, res.Activity = sum.Groups, sum.Activity
	unpaid, paid, err := a.extraRows(ctx, t)
	if err != nil {
		return a.classifyVoidErr(err)
	}
	res.Voided, res.Refund = unpaid, paid
	if opt.IncludePaid {
		res.Voided = append(append([]Row(nil), unpaid...), paid...)
	}
	if res.VoidedAmount, err = a.total(res.Voided); err != nil {
		return err
	}
	res.RefundAmount, err = a.total(res.Refund)
	return err
}

func (a *Auditor) update(ctx context.Context, tx conn, opt VoidOptions, want []Row) error {
	wantIDs := make([]string, len(want))
	for i, r := range want {
		wantIDs[i] = r.ID
	}
	if a.d.voidByID() {
		return a.updateByID(ctx, tx, opt, wantIDs)
	}
	rows, err := tx.query(ctx, a.d.void(a.p), a.p.spec.VoidValue, a.p.spec.PaidValues, opt.IncludePaid, opt.Reason, opt.Actor, a.p.spec.VoidValue)
	if err != nil {
		return a.classifyVoidErr(fmt.Errorf("voiding rows in %s: %w", a.p.table, err))
	}
	var got []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return a.classifyVoidErr(fmt.Errorf("voiding rows in %s: %w", a.p.table, err))
		}
		got = append(got, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return a.classifyVoidErr(fmt.Errorf("voiding rows in %s: %w", a.p.table, err))
	}
	// The listed rows and the updated rows come from the same snapshot and
	// the same ranking, so they must match; if not, write nothing.
	sort.Strings(wantIDs)
	sort.Strings(got)
	if strings.Join(wantIDs, "\x00") != strings.Join(got, "\x00") {
		return fmt.Errorf("%w: listed %d rows to void but the update matched %d; nothing was written", ErrConcurrentChange, len(wantIDs), len(got))
	}
	return nil
}

// voidBatch bounds the ids of one UPDATE (MySQL takes at most 65535 bind
// parameters in a statement).
const voidBatch = 1000

// updateByID voids the listed rows by id, in batches, for an engine whose
// UPDATE returns no rows: the transaction already locked what it read, so
// the count of rows changed must be the count listed.
func (a *Auditor) updateByID(ctx context.Context, tx conn, opt VoidOptions, ids []string) error {
	var n int64
	for start := 0; start < len(ids); start += voidBatch {
		batch := ids[start:min(start+voidBatch, len(ids))]
		got, err := tx.exec(ctx, a.d.void(a.p), a.p.spec.VoidValue, a.p.spec.PaidValues, opt.IncludePaid, opt.Reason, opt.Actor, a.p.spec.VoidValue, batch)
		if err != nil {
			return a.classifyVoidErr(fmt.Errorf("voiding rows in %s: %w", a.p.table, err))
		}
		n += got
	}
	if n != int64(len(ids)) {
		return fmt.Errorf("%w: listed %d rows to void but the update changed %d; nothing was written", ErrConcurrentChange, len(ids), n)
	}
	return nil
}

// classifyVoidErr marks serialization failures, deadlocks and lock waits
// (a listed row was changed, or is being changed, by another transaction)
// as ErrConcurrentChange.
func (a *Auditor) classifyVoidErr(err error) error {
	if a.d.conflict(err) {
		return fmt.Errorf("%w; nothing was written, run again: %w", ErrConcurrentChange, err)
	}
	return err
}

// total adds decimal amounts exactly; nil without an amount column.
func (a *Auditor) total(rows []Row) (*string, error) {
	if a.p.amount == nil {
		return nil, nil
	}
	sum := new(big.Rat)
	scale := 0
	for _, r := range rows {
		if r.Amount == nil {
			continue
		}
		v, ok := new(big.Rat).SetString(*r.Amount)
		if !ok {
			return nil, fmt.Errorf("amount %q of row %s is not a decimal number", *r.Amount, r.ID)
		}
		sum.Add(sum, v)
		if i := strings.IndexByte(*r.Amount, '.'); i >= 0 && len(*r.Amount)-i-1 > scale {
			scale = len(*r.Amount) - i - 1
		}
	}
	s := sum.FloatString(scale)
	return &s, nil
}
