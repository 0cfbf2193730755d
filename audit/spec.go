package audit

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrInvalidSpec is wrapped by every error about a [Spec] that is refused
// before any SQL runs.
var ErrInvalidSpec = errors.New("invalid audit spec")

// Spec names the business table to audit and the columns that matter. Every
// name is validated and quoted as an identifier; no part of a Spec is ever
// pasted into SQL as text, and values travel as bind parameters (the one
// exception, the void value in the guard index predicate, is restricted to a
// safe alphabet because DDL takes no parameters).
type Spec struct {
	// Table is the business table, optionally schema-qualified
	// ("billing.invoices"). Required.
	Table string
	// Key lists the columns of the business key that must be unique among
	// live rows, for example customer_id and period. Required, 1 to 32
	// columns. Rows with NULL in any key column are left out of every count:
	// a unique index does not constrain them either.
	Key []string
	// ID is the row identity column, used to keep the earliest row when two
	// rows share a time and to name rows in reports. Defaults to "id";
	// [NoColumn] for a table without one (see there).
	ID string
	// Time is the creation time column; the earliest row of a group is kept.
	// Defaults to "created_at".
	Time string
	// Amount is an optional money column; when set, reports carry exact
	// totals (computed by the database, returned as decimal text).
	Amount string
	// Status is the status column. Defaults to "status"; [NoColumn] for a
	// table without one, where every row is live.
	Status string
	// VoidValue is the status that marks a voided duplicate; rows with it are
	// not live. Defaults to "VoidedDuplicate".
	VoidValue string
	// PaidValues are the statuses of rows already paid: they are never
	// voided unless asked, and are listed for refund. Defaults to ["Paid"].
	PaidValues []string
	// ReasonColumn, ActorColumn and VoidedAtColumn receive why, by whom and
	// when a row was voided. Default to "voided_reason", "voided_by" and
	// "voided_at"; [VoidOptions.AddColumns] creates them when missing.
	ReasonColumn   string
	ActorColumn    string
	VoidedAtColumn string
	// PreviousStatusColumn receives the status a row had before the void,
	// so a voided row that was Paid still says so. Defaults to
	// "voided_from_status"; "-" records nothing.
	PreviousStatusColumn string
	// QuietPeriod decides whether duplicates are still being created: they
	// are when the newest extra row of any duplicate group is younger than
	// QuietPeriod on the database clock. Defaults to 1 hour.
	QuietPeriod time.Duration
}

// plan is a validated Spec with every name parsed.
type plan struct {
	spec     Spec
	table    Ident
	key      []Ident
	id       Ident // nil when the table has no id column: rows go by ctid
	time     Ident
	amount   Ident // nil when no amount column
	status   Ident // nil when the table has no status column: every row is live
	reason   Ident
	actor    Ident
	voidedAt Ident
	prev     Ident // nil when not recorded
}

func (s *Spec) setDefaults() {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&s.ID, "id")
	def(&s.Time, "created_at")
	def(&s.Status, "status")
	def(&s.VoidValue, "VoidedDuplicate")
	def(&s.ReasonColumn, "voided_reason")
	def(&s.ActorColumn, "voided_by")
	def(&s.VoidedAtColumn, "voided_at")
	def(&s.PreviousStatusColumn, "voided_from_status")
	if len(s.PaidValues) == 0 {
		s.PaidValues = []string{"Paid"}
	}
	if s.QuietPeriod == 0 {
		s.QuietPeriod = time.Hour
	}
}

// compile applies defaults and validates every name, collecting all
// problems so one run shows them all.
func compile(s Spec) (*plan, error) {
	s.setDefaults()
	s.PaidValues = append([]string(nil), s.PaidValues...)
	s.Key = append([]string(nil), s.Key...)
	p := &plan{spec: s}
	var errs []error
	ident := func(what, name string, qualified bool) Ident {
		id, err := ParseIdent(name, qualified)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
		return id
	}
	p.table = ident("table", s.Table, true)
	if len(s.Key) == 0 {
		errs = append(errs, fmt.Errorf("%w: key: at least one column is required", ErrInvalidSpec))
	}
	if len(s.Key) > 32 {
		errs = append(errs, fmt.Errorf("%w: key: %d columns, at most 32", ErrInvalidSpec, len(s.Key)))
	}
	seen := map[string]bool{}
	for _, k := range s.Key {
		k = strings.TrimSpace(k)
		if seen[k] {
			errs = append(errs, fmt.Errorf("%w: key: column %q listed twice", ErrInvalidSpec, k))
		}
		seen[k] = true
		p.key = append(p.key, ident("key", k, false))
	}
	if s.ID != NoColumn {
		p.id = ident("id column", s.ID, false)
	}
	p.time = ident("time column", s.Time, false)
	if s.Amount != "" {
		p.amount = ident("amount column", s.Amount, false)
	}
	if s.Status != NoColumn {
		p.status = ident("status column", s.Status, false)
	}
	p.reason = ident("reason column", s.ReasonColumn, false)
	p.actor = ident("actor column", s.ActorColumn, false)
	p.voidedAt = ident("voided-at column", s.VoidedAtColumn, false)
	if s.PreviousStatusColumn != "-" {
		p.prev = ident("previous-status column", s.PreviousStatusColumn, false)
	}
	if err := validLiteral("void value", s.VoidValue); err != nil {
		errs = append(errs, err)
	}
	for _, v := range s.PaidValues {
		if v == "" {
			errs = append(errs, fmt.Errorf("%w: paid value: empty", ErrInvalidSpec))
		}
		if v == s.VoidValue {
			errs = append(errs, fmt.Errorf("%w: paid value %q equals the void value", ErrInvalidSpec, v))
		}
	}
	if s.QuietPeriod < 0 {
		errs = append(errs, fmt.Errorf("%w: quiet period %v is negative", ErrInvalidSpec, s.QuietPeriod))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// The audit columns must not collide with the columns the audit reads:
	// voiding would overwrite the evidence.
	audit := map[string]string{s.ReasonColumn: "reason", s.ActorColumn: "actor", s.VoidedAtColumn: "voided-at"}
	want := 3
	if p.prev != nil {
		audit[s.PreviousStatusColumn] = "previous-status"
		want++
	}
	if len(audit) != want {
		errs = append(errs, fmt.Errorf("%w: the reason, actor, voided-at and previous-status columns must be different columns", ErrInvalidSpec))
	}
	for _, c := range append([]string{s.ID, s.Time, s.Amount, s.Status}, s.Key...) {
		if what, ok := audit[c]; ok && c != "" && c != NoColumn {
			errs = append(errs, fmt.Errorf("%w: the %s column %q is also a column the audit reads", ErrInvalidSpec, what, c))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// keyNames returns the key column names as given.
func (p *plan) keyNames() []string {
	out := make([]string, len(p.key))
	for i, k := range p.key {
		out[i] = k.Name()
	}
	return out
}

// NoColumn, as [Spec.Status] or [Spec.ID], says the table has no such
// column. Without a status column every row is live (nothing can be
// voided, and the guard is a plain unique index); without an id column
// rows are told apart by their physical address (PostgreSQL's ctid),
// which is enough to count, list and fence duplicates but not to void
// them: [Auditor.Void] refuses.
const NoColumn = "-"
