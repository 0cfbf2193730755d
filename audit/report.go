package audit

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Group is one business key held by more than one live row.
type Group struct {
	// Key holds the key's values as text, in the order of [Spec.Key].
	Key  []string `json:"key"`
	Rows int64    `json:"rows"`
	// Earliest and Latest are the creation times of the group's first and
	// last rows (nil when the time column is NULL).
	Earliest *time.Time `json:"earliest"`
	Latest   *time.Time `json:"latest"`
	// Amount is the group's total and ExtraAmount the part held by the rows
	// after the earliest, exact decimal text; nil without an amount column.
	Amount      *string `json:"amount,omitempty"`
	ExtraAmount *string `json:"extra_amount,omitempty"`
	// PaidRows counts the group's paid rows, PaidExtras those among the rows
	// after the earliest (they need a refund before they may be voided).
	PaidRows   int64 `json:"paid_rows"`
	PaidExtras int64 `json:"paid_extras"`
	// KeepID is the id of the earliest row, the one void keeps.
	KeepID string `json:"keep_id"`
}

// Activity is the verdict on whether duplicates are still being created.
//
// Definition: duplicates are still being created when the newest extra row
// (any row but the earliest of a duplicate group, among live rows) was
// created less than the quiet period ago, measured on the database clock
// (now() at the start of the audit's transaction). A newest extra row in the
// future also counts as recent. With no extra row at all, they are not.
//
// The reasoning is the incident's: if the newest duplicate is from
// yesterday, the producer is still running and cleaning up is wasted work
// that will come back; fix the consumer first. If it stops advancing after
// the fix is deployed, the source has stopped and the data can be repaired.
type Activity struct {
	StillBeingCreated bool `json:"still_being_created"`
	// NewestDuplicate is the creation time of the newest extra row.
	NewestDuplicate *time.Time `json:"newest_duplicate,omitempty"`
	// Age is Now minus NewestDuplicate, in seconds.
	AgeSeconds  float64   `json:"age_seconds,omitempty"`
	QuietPeriod string    `json:"quiet_period"`
	Now         time.Time `json:"now"`
	age         time.Duration
	quiet       time.Duration
}

// Age is how long ago the newest extra row was created.
func (a Activity) Age() time.Duration { return a.age }

// Verdict says in one sentence whether duplicates are still being created.
func (a Activity) Verdict() string {
	switch {
	case a.NewestDuplicate == nil:
		return "no duplicates among live rows"
	case a.StillBeingCreated:
		return fmt.Sprintf("STILL BEING CREATED: the newest duplicate row is from %s, %s ago, inside the quiet period of %s; stop or fix the producer before voiding",
			a.NewestDuplicate.UTC().Format(timeLayout), roundAge(a.age), a.quiet)
	default:
		return fmt.Sprintf("not being created any more: the newest duplicate row is from %s, %s ago (quiet period %s)",
			a.NewestDuplicate.UTC().Format(timeLayout), roundAge(a.age), a.quiet)
	}
}

const timeLayout = "2006-01-02 15:04:05Z07:00"

// roundAge renders an age at the precision a human needs: seconds under a
// minute, minutes under a day, then days and hours.
func roundAge(d time.Duration) string {
	switch {
	case d < time.Minute && d > -time.Minute:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	default:
		h := int64(d.Round(time.Hour) / time.Hour)
		return fmt.Sprintf("%dd%dh", h/24, h%24)
	}
}

// Summary totals every duplicate group; the numbers are exact and do not
// depend on how many groups a report lists.
type Summary struct {
	Groups int64 `json:"groups"`
	// Rows counts the live rows in duplicate groups; ExtraRows those beyond
	// the earliest of each group (Rows - Groups).
	Rows      int64 `json:"rows"`
	ExtraRows int64 `json:"extra_rows"`
	// Amount totals the rows of duplicate groups, ExtraAmount the extra rows.
	Amount      *string `json:"amount,omitempty"`
	ExtraAmount *string `json:"extra_amount,omitempty"`
	// PaidRows counts paid rows in duplicate groups; PaidExtraRows and
	// PaidExtraAmount the paid extra rows, which need a refund.
	PaidRows        int64   `json:"paid_rows"`
	PaidExtraRows   int64   `json:"paid_extra_rows"`
	PaidExtraAmount *string `json:"paid_extra_amount,omitempty"`
	// UnpaidExtraRows are the rows a void marks, UnpaidExtraAmount their
	// total.
	UnpaidExtraRows   int64    `json:"unpaid_extra_rows"`
	UnpaidExtraAmount *string  `json:"unpaid_extra_amount,omitempty"`
	Activity          Activity `json:"activity"`
}

// Report is the result of [Auditor.Duplicates].
type Report struct {
	Table      string   `json:"table"`
	KeyColumns []string `json:"key_columns"`
	Summary    Summary  `json:"summary"`
	// Groups lists duplicate groups, newest first, at most the limit asked.
	Groups []Group `json:"groups"`
	// Truncated is set when Groups holds fewer than Summary.Groups.
	Truncated bool `json:"truncated"`
}

// Duplicates reports the duplicate groups among live rows, at most limit
// of them (0 lists all), with exact totals and the activity verdict. It only
// reads, in one REPEATABLE READ transaction, so the list and the totals
// describe the same moment.
func (a *Auditor) Duplicates(ctx context.Context, limit int) (*Report, error) {
	tx, err := a.db.begin(ctx, readOnly)
	if err != nil {
		return nil, fmt.Errorf("beginning audit transaction: %w", err)
	}
	defer func() { _ = tx.rollback(context.WithoutCancel(ctx)) }()
	if _, err := a.inspect(ctx, tx, true); err != nil {
		return nil, err
	}
	sum, err := a.summary(ctx, tx)
	if err != nil {
		return nil, err
	}
	groups, err := a.groups(ctx, tx, limit)
	if err != nil {
		return nil, err
	}
	return &Report{
		Table:      a.p.table.String(),
		KeyColumns: a.p.keyNames(),
		Summary:    *sum,
		Groups:     groups,
		Truncated:  int64(len(groups)) < sum.Groups,
	}, nil
}

func (a *Auditor) args() []any { return []any{a.p.spec.VoidValue, a.p.spec.PaidValues} }

func (a *Auditor) summary(ctx context.Context, q conn) (*Summary, error) {
	var s Summary
	var newest *time.Time
	err := q.queryRow(ctx, a.d.summary(a.p), a.args()...).Scan(
		&s.Groups, &s.Rows, &s.ExtraRows, &s.Amount, &s.ExtraAmount,
		&s.PaidRows, &s.PaidExtraRows, &s.PaidExtraAmount, &s.UnpaidExtraAmount, &newest, &s.Activity.Now)
	if err != nil {
		return nil, fmt.Errorf("summarizing duplicates in %s: %w", a.p.table, err)
	}
	s.UnpaidExtraRows = s.ExtraRows - s.PaidExtraRows
	act := &s.Activity
	act.quiet = a.p.spec.QuietPeriod
	act.QuietPeriod = act.quiet.String()
	if newest != nil {
		act.NewestDuplicate = newest
		act.age = act.Now.Sub(*newest)
		act.AgeSeconds = act.age.Seconds()
		act.StillBeingCreated = act.age < act.quiet
	} else if s.ExtraRows > 0 {
		// Extra rows whose creation time is NULL: age unknown, so the
		// verdict cannot say the source has stopped.
		act.StillBeingCreated = true
	}
	return &s, nil
}

func (a *Auditor) groups(ctx context.Context, q conn, limit int) ([]Group, error) {
	lim := int64(math.MaxInt64)
	if limit > 0 {
		lim = int64(limit)
	}
	rows, err := q.query(ctx, a.d.groups(a.p), append(a.args(), lim)...)
	if err != nil {
		return nil, fmt.Errorf("listing duplicate groups in %s: %w", a.p.table, err)
	}
	defer rows.Close()
	var out []Group
	n := len(a.p.key)
	for rows.Next() {
		g := Group{Key: make([]string, n)}
		dest := make([]any, 0, n+9)
		for i := range g.Key {
			dest = append(dest, &g.Key[i])
		}
		dest = append(dest, &g.Rows, &g.Earliest, &g.Latest, &g.Amount, &g.ExtraAmount, &g.PaidRows, &g.PaidExtras, &g.KeepID)
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("reading duplicate groups in %s: %w", a.p.table, err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing duplicate groups in %s: %w", a.p.table, err)
	}
	return out, nil
}

// Row is one extra row: voided, to be voided, or listed for refund.
type Row struct {
	ID string `json:"id"`
	// KeepID is the id of the earliest row of the same key, the one kept.
	KeepID  string     `json:"keep_id"`
	Key     []string   `json:"key"`
	Created *time.Time `json:"created_at"`
	Amount  *string    `json:"amount,omitempty"`
	Status  *string    `json:"status"`
}

// extraRows lists every extra row, split into unpaid and paid.
func (a *Auditor) extraRows(ctx context.Context, q conn) (unpaid, paid []Row, err error) {
	rows, err := q.query(ctx, a.d.rows(a.p), a.args()...)
	if err != nil {
		return nil, nil, fmt.Errorf("listing extra rows in %s: %w", a.p.table, err)
	}
	defer rows.Close()
	n := len(a.p.key)
	for rows.Next() {
		r := Row{Key: make([]string, n)}
		var isPaid bool
		dest := []any{&r.ID, &r.KeepID}
		for i := range r.Key {
			dest = append(dest, &r.Key[i])
		}
		dest = append(dest, &r.Created, &r.Amount, &r.Status, &isPaid)
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, fmt.Errorf("reading extra rows in %s: %w", a.p.table, err)
		}
		if isPaid {
			paid = append(paid, r)
		} else {
			unpaid = append(unpaid, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("listing extra rows in %s: %w", a.p.table, err)
	}
	return unpaid, paid, nil
}
