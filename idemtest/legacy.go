package idemtest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// Severity is what a duplicate delivery costs, the scale the plan ranks by.
type Severity int

// Severities, worst first. Unrated sorts before Critical in a plan: unknown
// damage is treated as the worst until someone rates it.
const (
	Unrated Severity = iota
	// Critical: money lost that cannot be undone (an invoice, a charge, a
	// transfer).
	Critical
	// High: wrong business data that needs manual repair (stock, orders,
	// accounts).
	High
	// Medium: wrong figures or an annoyed user (running totals, a second
	// email or SMS).
	Medium
	// Low: noise, no wrong data (a log line, a cache refresh).
	Low
)

var severityNames = [...]string{"unrated", "critical", "high", "medium", "low"}

// String returns the lower-case name.
func (s Severity) String() string {
	if s < Unrated || s > Low {
		return fmt.Sprintf("severity(%d)", int(s))
	}
	return severityNames[s]
}

// LegacyHandler is a consumer written without idem: it applies a message
// and commits on its own.
type LegacyHandler func(ctx context.Context, msg idem.Message) error

// Legacy describes a consumer to probe, with what the team knows about it.
type Legacy struct {
	// Consumer names it.
	Consumer string
	// Handler is the consumer's entry point.
	Handler LegacyHandler
	// Sample is a message as its producer sends it.
	Sample idem.Message
	// Snapshot reads the state the consumer changes. Several probes may
	// share one database: each compares only before and after its own
	// deliveries.
	Snapshot Snapshotter
	// Severity rates what a duplicate costs; see [Severity].
	Severity Severity
	// Damage says in business words what a duplicate does ("second invoice,
	// customer charged twice").
	Damage string
	// Fix is the suggested key or change ("key invoice:{customer}:{period}",
	// "recompute the total instead of adding").
	Fix string
	// AllowNoEffect accepts a sample that changes nothing the snapshot sees
	// (an effect outside the database); otherwise [Ratchet] rejects such a
	// finding as proving nothing.
	AllowNoEffect bool
}

// Finding is what [Probe] learned about one legacy consumer.
type Finding struct {
	Legacy
	// Idempotent is true when the second delivery succeeded and changed
	// nothing.
	Idempotent bool
	// Effect is what the first delivery changed.
	Effect Diff
	// Redelivery is what the second delivery changed: the damage.
	Redelivery Diff
	// Err is the second delivery's error. A redelivery that fails is not
	// idempotent either: the broker redelivers it again and again, or
	// dead-letters a message that was fine.
	Err error
}

// Probe delivers l.Sample to l.Handler twice and reports what the second
// delivery changed. It returns an error only when the probe itself cannot
// run (a snapshot fails, or the first delivery does).
func Probe(ctx context.Context, l Legacy) (Finding, error) {
	f := Finding{Legacy: l}
	s0, err := l.Snapshot.Snapshot(ctx)
	if err != nil {
		return f, fmt.Errorf("probing %s: snapshot before: %w", l.Consumer, err)
	}
	if err := l.Handler(ctx, l.Sample); err != nil {
		return f, fmt.Errorf("probing %s: first delivery: %w", l.Consumer, err)
	}
	s1, err := l.Snapshot.Snapshot(ctx)
	if err != nil {
		return f, fmt.Errorf("probing %s: snapshot after the first delivery: %w", l.Consumer, err)
	}
	f.Err = l.Handler(ctx, l.Sample)
	s2, err := l.Snapshot.Snapshot(ctx)
	if err != nil {
		return f, fmt.Errorf("probing %s: snapshot after the second delivery: %w", l.Consumer, err)
	}
	f.Effect, f.Redelivery = Compare(s0, s1), Compare(s1, s2)
	f.Idempotent = f.Err == nil && f.Redelivery.Empty()
	return f, nil
}

// Measured describes the damage the second delivery did: the tables and
// columns it changed, and its error if it failed.
func (f Finding) Measured() string {
	parts := []string{}
	if !f.Redelivery.Empty() {
		parts = append(parts, f.Redelivery.Summary())
	}
	if f.Err != nil {
		parts = append(parts, "redelivery fails: "+f.Err.Error())
	}
	return strings.Join(parts, "; ")
}

// ProbeAll probes each of ls in order and returns the findings, stopping t
// if a probe cannot run. Probes share nothing but the database.
func ProbeAll(t testing.TB, ls ...Legacy) []Finding {
	t.Helper()
	out := make([]Finding, 0, len(ls))
	for _, l := range ls {
		f, err := Probe(t.Context(), l)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// Rank returns the non-idempotent findings in the order to fix them: by
// severity (unrated first), then by measured damage (most rows changed by
// the redelivery first), then by name.
func Rank(findings []Finding) []Finding {
	var out []Finding
	for _, f := range findings {
		if !f.Idempotent {
			out = append(out, f)
		}
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		return cmp.Or(
			cmp.Compare(a.Severity, b.Severity),
			cmp.Compare(b.Redelivery.Len(), a.Redelivery.Len()),
			strings.Compare(a.Consumer, b.Consumer),
		)
	})
	return out
}

// Plan renders the findings as the prioritized fix plan, a Markdown table
// to paste into an issue: consumers that are not idempotent in the order of
// [Rank], each with its severity, the damage as declared and as measured
// (the tables and columns the second delivery changed), and the suggested
// fix; then the consumers that passed.
func Plan(findings []Finding) string {
	var b strings.Builder
	ranked := Rank(findings)
	b.WriteString("| # | consumer | severity | damage | changed by the 2nd delivery | suggested fix |\n")
	b.WriteString("|--:|---|---|---|---|---|\n")
	for i, f := range ranked {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n",
			i+1, cell(f.Consumer), f.Severity, cell(f.Damage), cell(f.Measured()), cell(f.Fix))
	}
	var ok []string
	for _, f := range findings {
		if f.Idempotent {
			ok = append(ok, f.Consumer)
		}
	}
	slices.Sort(ok)
	fmt.Fprintf(&b, "\n%d of %d consumers not idempotent.", len(ranked), len(findings))
	if len(ok) > 0 {
		fmt.Fprintf(&b, " Idempotent: %s.", strings.Join(ok, ", "))
	}
	b.WriteByte('\n')
	return b.String()
}

// cell keeps a value from breaking the Markdown table.
func cell(s string) string {
	if s == "" {
		return "—"
	}
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// Ratchet fails t when the list of known non-idempotent consumers is out of
// date, so that it can only shrink: a consumer not on known that is not
// idempotent fails (fix it; do not add it), a consumer on known that has
// become idempotent fails (remove it from the list, so it stays fixed), and
// so does a name on known that was not probed, and a finding whose sample
// changed nothing (it proves nothing) unless the case allows it.
func Ratchet(t testing.TB, findings []Finding, known ...string) {
	t.Helper()
	probed := map[string]bool{}
	for _, f := range findings {
		probed[f.Consumer] = true
		isKnown := slices.Contains(known, f.Consumer)
		switch {
		case f.Effect.Empty() && !f.AllowNoEffect:
			t.Errorf("%s: the sample's first delivery changed nothing the snapshot sees, so the probe proves nothing; fix the sample or the snapshot, or set AllowNoEffect", f.Consumer)
		case !f.Idempotent && !isKnown:
			t.Errorf("%s is not idempotent (%s) and not on the list of known ones: fix it rather than add it to the list", f.Consumer, f.Measured())
		case f.Idempotent && isKnown:
			t.Errorf("%s is idempotent now: remove it from the list of known non-idempotent consumers, so that it stays fixed", f.Consumer)
		}
	}
	for _, k := range known {
		if !probed[k] {
			t.Errorf("%s is on the list of known non-idempotent consumers but was not probed: remove it, or probe it", k)
		}
	}
}
