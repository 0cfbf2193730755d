package audit

import (
	"os"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/leakcheck"
)

// TestMain fails the run when a test left a goroutine running (a pool or a
// transaction not closed).
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m, 30*time.Second)) }
