package idem

import (
	"strings"

	"github.com/idemkit/idem/idemstore"
)

// SchemaError is the problems a store's schema check
// ([idemstore.Store.Check]) found with an inbox table, each naming the
// table. It is a configuration error: errors.Is(err, ErrConfig) holds.
type SchemaError struct {
	Problems []idemstore.SchemaProblem
}

// Error lists every problem with its fix.
func (e *SchemaError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap makes a SchemaError an [ErrConfig]: waiting does not fix it.
func (e *SchemaError) Unwrap() error { return ErrConfig }
