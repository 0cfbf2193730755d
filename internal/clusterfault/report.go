package clusterfault

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Figure is what one scenario measured.
type Figure struct {
	// Scenario names the cluster and the fault, e.g.
	// "postgres/async: primary killed, replica promoted".
	Scenario string `json:"scenario"`
	// Messages is how many distinct messages were published.
	Messages int `json:"messages"`
	// Kills is how many nodes (or leaders) were killed or taken away.
	Kills int `json:"kills"`
	// Acked is how many distinct messages the broker holds as acknowledged
	// (committed offsets, acked deliveries) at the end.
	Acked int `json:"acked"`
	// Lost is how many acknowledged messages have no effect at the end.
	Lost int `json:"lost"`
	// Doubled is how many messages have more than one effect.
	Doubled int `json:"doubled"`
	// Note says anything the figures need to be read right.
	Note string `json:"note,omitempty"`
}

var (
	mu      sync.Mutex
	figures []Figure
)

// Full reports whether the whole suite runs (IDEM_CLUSTER=1), not only the
// smoke cases.
func Full() bool { return os.Getenv("IDEM_CLUSTER") == "1" }

// Record logs f on t and keeps it for the report.
func Record(t testing.TB, f Figure) {
	t.Helper()
	t.Logf("figure: %s: messages=%d kills=%d acked=%d lost=%d doubled=%d %s", f.Scenario, f.Messages, f.Kills, f.Acked, f.Lost, f.Doubled, f.Note)
	mu.Lock()
	figures = append(figures, f)
	mu.Unlock()
}

// Figures returns what was recorded, sorted by scenario.
func Figures() []Figure {
	mu.Lock()
	defer mu.Unlock()
	out := append([]Figure(nil), figures...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Scenario < out[j].Scenario })
	return out
}

// WriteReport writes the figures as JSON to path and as a Markdown table to w.
func WriteReport(path string, w io.Writer) error {
	fs := Figures()
	if len(fs) == 0 {
		return nil
	}
	b, err := json.MarshalIndent(fs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("clusterfault: writing %s: %w", path, err)
	}
	_, err = io.WriteString(w, Table(fs))
	return err
}

// Table renders figures as a Markdown table.
func Table(fs []Figure) string {
	var b strings.Builder
	b.WriteString("| scenario | messages | kills | acked | lost | doubled | note |\n|---|---:|---:|---:|---:|---:|---|\n")
	for _, f := range fs {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %s |\n", f.Scenario, f.Messages, f.Kills, f.Acked, f.Lost, f.Doubled, f.Note)
	}
	return b.String()
}
