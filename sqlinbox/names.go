package sqlinbox

import (
	"fmt"
	"regexp"
	"strings"
)

// identPart is what one part of a table name may look like. It is stricter
// than SQL requires on purpose: a name that needs no escaping cannot smuggle
// SQL, and 63 bytes is PostgreSQL's identifier limit (longer names are
// silently truncated there, so two long names could collide).
var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// tableName is a validated, possibly schema-qualified table name.
type tableName struct {
	schema string // empty: the connection's default (search_path, main)
	name   string
}

// parseTable validates name. qualified says whether the dialect accepts a
// "schema.table" form.
func parseTable(name string, qualified bool) (tableName, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 || (len(parts) == 2 && !qualified) {
		if qualified {
			return tableName{}, fmt.Errorf("table name %q: want table or schema.table", name)
		}
		return tableName{}, fmt.Errorf("table name %q: this dialect takes no schema qualification", name)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return tableName{}, fmt.Errorf("table name %q: each part must match %s", name, identPart)
		}
	}
	if len(parts) == 2 {
		return tableName{schema: parts[0], name: parts[1]}, nil
	}
	return tableName{name: parts[0]}, nil
}

// String is the name as the user wrote it, for errors and bookkeeping.
func (t tableName) String() string {
	if t.schema == "" {
		return t.name
	}
	return t.schema + "." + t.name
}
