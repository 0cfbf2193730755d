package clusterfault

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	if runNATSNode() {
		return
	}
	code := m.Run()
	if path := os.Getenv("IDEM_CLUSTER_REPORT"); path != "" {
		if err := WriteReport(path, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}
