package clusterfault

import (
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	got := Table([]Figure{{Scenario: "x", Messages: 3, Kills: 1, Acked: 3, Lost: 1, Doubled: 0}})
	if !strings.Contains(got, "| x | 3 | 1 | 3 | 1 | 0 |  |") {
		t.Fatalf("table row missing:\n%s", got)
	}
}
