package idem_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPackaging pins what each package links: a PostgreSQL user of
// sqlinbox or pgxinbox does not get SQLite (modernc.org/sqlite and its
// libc) in their binary, nor the MySQL driver, and the idem command builds on no example, so an
// example can change without changing the command.
func TestPackaging(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	cases := []struct {
		pkg       string
		forbidden string
	}{
		{"github.com/idemkit/idem/sqlinbox", "modernc.org/"},
		{"github.com/idemkit/idem/sqlinbox", "github.com/go-sql-driver/"},
		{"github.com/idemkit/idem/pgxinbox", "github.com/go-sql-driver/"},
		{"github.com/idemkit/idem/mysqlinbox", "modernc.org/"},
		{"github.com/idemkit/idem/pgxinbox", "modernc.org/"},
		{"github.com/idemkit/idem/idemrabbitmq", "modernc.org/"},
		{"github.com/idemkit/idem/idemkafka", "modernc.org/"},
		{"github.com/idemkit/idem/cmd/idem", "github.com/idemkit/idem/examples/"},
	}
	for _, c := range cases {
		out, err := exec.Command("go", "list", "-deps", c.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", c.pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, c.forbidden) {
				t.Errorf("%s depends on %s", c.pkg, dep)
			}
		}
	}
}
