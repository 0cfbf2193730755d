package idemotel_test

import (
	"os"
	"strings"
	"testing"
)

// TestLibraryDoesNotRequireOpenTelemetry: the dependency stays in this
// module; a user of idem without idemotel does not get it.
func TestLibraryDoesNotRequireOpenTelemetry(t *testing.T) {
	for _, f := range []string{"../go.mod", "../go.sum"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "go.opentelemetry.io/") {
			t.Errorf("%s names go.opentelemetry.io: the library module must not depend on OpenTelemetry", f)
		}
	}
}
