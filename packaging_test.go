package idem_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPackaging pins what each package links: a PostgreSQL user of
// sqlinbox or pgxinbox does not get SQLite (modernc.org/sqlite and its
// libc) in their binary, nor the MySQL driver. The idem command builds on
// one example only, the billing services its demo shows; and that example
// imports nothing internal, so it can be copied out as the start of a
// service.
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
		{"github.com/idemkit/idem/cmd/idem", "github.com/idemkit/idem/examples/service"},
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

// TestExamplesAreCopyable pins that the examples import only idem's public
// packages: a user copies one out of the repository as it is.
func TestExamplesAreCopyable(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	for _, pkg := range []string{"github.com/idemkit/idem/examples/billing", "github.com/idemkit/idem/examples/service"} {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, imp := range strings.Fields(string(out)) {
			if strings.HasPrefix(imp, "github.com/idemkit/idem/") && strings.Contains(imp+"/", "/internal/") {
				t.Errorf("%s imports %s, which a copy outside the repository cannot", pkg, imp)
			}
		}
	}
}
