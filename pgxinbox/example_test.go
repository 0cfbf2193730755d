package pgxinbox_test

import (
	"fmt"
	"log"
	"strings"

	"github.com/idemkit/idem/pgxinbox"
)

// The SQL Migrate runs, for a migration tool: paste it into a
// golang-migrate, goose, Atlas or Flyway migration (or let `idem inbox ddl
// --format goose` write the file). It starts by saying what it makes.
func ExampleDDL() {
	ddl, err := pgxinbox.DDL("billing.inbox", pgxinbox.Plain, 0)
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(ddl, "\n")[:3] {
		fmt.Println(line)
	}
	// Output:
	// -- idem inbox table billing.inbox: plain layout, postgres, schema version 2.
	// -- A new table records the retention window 14d (1209600000 ms); an existing one keeps its own.
	// -- Safe to run again: each migration runs only on a table below its version.
}
