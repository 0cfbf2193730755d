// Command chart draws the figures of a peers run (the JSON its -out
// writes) as horizontal bars: for each broker a group, one bar per
// consumer, its length the consumer's throughput as a multiple of the
// hand-rolled batched inbox on that broker (the reference line at 1), on
// a log scale. Each bar is labelled with that ratio and, where the broker
// ran outside the process, with its messages per second.
//
//	cd bench/peers && go run ./chart -in ../../docs/bench/peers.json -out ../../docs/bench/peers.svg
//
// The output is SVG, or PNG when -out ends in .png.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idem/bench/peers/report"
)

// The figures, as the peers command writes them.
type (
	Report  = report.Report
	Machine = report.Machine
	Result  = report.Result
	Check   = report.Check
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("chart", flag.ContinueOnError)
	in := fs.String("in", "", "the peers command's JSON report")
	out := fs.String("out", "", "the chart to write: .svg, or .png")
	dpi := fs.Int("dpi", 96, "pixels per inch of a PNG (96: 800 pixels wide)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" || fs.NArg() > 0 || *dpi < 1 {
		return fmt.Errorf("usage: chart -in FILE.json -out FILE.svg|FILE.png")
	}
	rep, err := load(*in)
	if err != nil {
		return err
	}
	format := "svg"
	if strings.EqualFold(filepath.Ext(*out), ".png") {
		format = "png"
	}
	var buf bytes.Buffer
	if err := Render(&buf, rep, format, *dpi); err != nil {
		return err
	}
	return os.WriteFile(*out, buf.Bytes(), 0o644)
}

func load(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(rep.Results) == 0 {
		return nil, fmt.Errorf("%s: no results", path)
	}
	return &rep, nil
}

// Best is each consumer's best run (report.Best).
func Best(rs []Result) []Result { return report.Best(rs) }

// group is one broker's best results, in the report's order.
type group struct {
	Broker  string
	Results []Result
}

func groups(rs []Result) []group {
	var gs []group
	at := map[string]int{}
	for _, r := range Best(rs) {
		i, ok := at[r.Broker]
		if !ok {
			i = len(gs)
			at[r.Broker] = i
			gs = append(gs, group{Broker: r.Broker})
		}
		gs[i].Results = append(gs[i].Results, r)
	}
	return gs
}

// brokerName is how the chart spells a broker.
func brokerName(b string) string {
	switch b {
	case "rabbitmq":
		return "RabbitMQ"
	case "kafka":
		return "Kafka"
	case "nats":
		return "NATS JetStream"
	case "redis":
		return "Redis Streams"
	case "":
		return "?"
	}
	return b
}

// title says what was measured.
func title(rep *Report) string {
	s := fmt.Sprintf("%s messages + %s redeliveries, batch %d, prefetch %d",
		thousands(float64(rep.Messages)), thousands(float64(rep.Dups)), rep.Batch, rep.Prefetch)
	runs := 0
	for _, r := range rep.Results {
		runs = max(runs, r.Iteration)
	}
	if runs > 1 {
		s += fmt.Sprintf(", best of %d runs", runs)
	}
	return s
}

// machineLine says what it was measured on, naming the brokers present.
func machineLine(rep *Report, gs []group) string {
	m := rep.Machine
	var parts []string
	if m.CPUs > 0 {
		parts = append(parts, fmt.Sprintf("%d CPUs", m.CPUs))
	}
	if m.OS != "" {
		parts = append(parts, m.OS)
	}
	if m.Go != "" {
		parts = append(parts, m.Go)
	}
	if m.Postgres != "" {
		v, _, _ := strings.Cut(m.Postgres, " (")
		parts = append(parts, "PostgreSQL "+v)
	}
	for _, g := range gs {
		v := ""
		switch g.Broker {
		case "rabbitmq":
			v = m.RabbitMQ
		case "kafka":
			v = m.Kafka
		case "nats":
			v = m.NATS
		case "redis":
			v = m.Redis
		}
		if v == "" {
			v = "version unknown"
		}
		parts = append(parts, brokerName(g.Broker)+" "+v)
	}
	return strings.Join(parts, " · ")
}

// label is the text beside a result's bar.
func label(r Result) string {
	if r.Error != "" {
		return "failed: " + shorten(r.Error, 60)
	}
	if r.Ratio <= 0 {
		s := "no hand-rolled batched baseline"
		if r.Absolute {
			s = thousands(r.Rate) + " msgs/s, " + s
		}
		return s
	}
	s := ratio(r.Ratio)
	if r.Absolute {
		s += " · " + thousands(r.Rate) + " msgs/s"
	}
	if !r.OK && r.Check.Doubled > 0 {
		s += fmt.Sprintf(" · %d doubled", r.Check.Doubled)
	}
	if !r.OK && r.Check.Missing > 0 {
		s += fmt.Sprintf(" · %d missing", r.Check.Missing)
	}
	return s
}

// ratio formats a multiple of the baseline: two significant digits
// below 1, two decimals up to 10.
func ratio(v float64) string {
	switch {
	case v >= 10:
		return fmt.Sprintf("%.0f×", v)
	case v >= 1:
		return fmt.Sprintf("%.2f×", v)
	}
	return fmt.Sprintf("%.2g×", v)
}

// thousands formats v rounded, with a comma between thousands.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func shorten(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
