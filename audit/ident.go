package audit

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ErrInvalidName is wrapped by every error about a table, column or index
// name that idem refuses to put into SQL.
var ErrInvalidName = errors.New("invalid SQL name")

// identPart is deliberately narrower than what PostgreSQL accepts between
// double quotes: a name that needs more than letters, digits, _ and $ is far
// more likely to be an injection attempt than a real table, and refusing it
// is cheaper than proving the quoting right for every dialect.
var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*$`)

// maxIdentLen is PostgreSQL's NAMEDATALEN-1 (MySQL's limit, 64, is larger).
const maxIdentLen = 63

// Ident is a validated SQL name: one part ("invoices") or schema-qualified
// ("billing.invoices"). Its parts are matched exactly as written: the name
// is always quoted, so Invoices and invoices are different tables.
type Ident []string

// ParseIdent validates name, which may be schema-qualified when qualified
// is true. It refuses anything but letters, digits, _ and $ in each part.
func ParseIdent(name string, qualified bool) (Ident, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty name", ErrInvalidName)
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 || (!qualified && len(parts) > 1) {
		want := "a plain name"
		if qualified {
			want = "a name or schema.name"
		}
		return nil, fmt.Errorf("%w %q: want %s", ErrInvalidName, name, want)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return nil, fmt.Errorf("%w %q: each part must be letters, digits, _ or $, starting with a letter or _ (no quotes, spaces or punctuation)", ErrInvalidName, name)
		}
		if len(p) > maxIdentLen {
			return nil, fmt.Errorf("%w %q: a part is longer than %d bytes", ErrInvalidName, name, maxIdentLen)
		}
	}
	return Ident(parts), nil
}

// Name returns the last part: the bare table or column name.
func (id Ident) Name() string { return id[len(id)-1] }

// nameOf is id's Name, or "" for a column the table does not have.
func nameOf(id Ident) string {
	if id == nil {
		return ""
	}
	return id.Name()
}

// String returns the name as given, dot-joined and unquoted.
func (id Ident) String() string { return strings.Join(id, ".") }

// quoteIdentANSI quotes each part with double quotes, doubling any quote
// inside (none survive validation; the doubling is defence in depth).
func quoteIdentANSI(id Ident) string {
	var b strings.Builder
	for i, p := range id {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteByte('"')
		b.WriteString(strings.ReplaceAll(p, `"`, `""`))
		b.WriteByte('"')
	}
	return b.String()
}

// literalValue is what a status value may contain when it has to appear as a
// literal in DDL (an index predicate cannot take bind parameters).
var literalValue = regexp.MustCompile(`^[A-Za-z0-9_ .:-]{1,100}$`)

func validLiteral(what, v string) error {
	if !literalValue.MatchString(v) {
		return fmt.Errorf("%w: %s %q must be 1-100 letters, digits, spaces or _ . : - (it is written into the index predicate)", ErrInvalidSpec, what, v)
	}
	return nil
}
