package idemtest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/pgtest"
)

const legacyDDL = `
CREATE TABLE invoices (id bigserial PRIMARY KEY, customer text, period text, total bigint);
CREATE TABLE commissions (id bigserial PRIMARY KEY, order_id text, amount bigint);
CREATE TABLE stock (product text PRIMARY KEY, qty int);
CREATE TABLE stats (month text PRIMARY KEY, revenue bigint);
CREATE TABLE audit_log (event text);
CREATE TABLE emails_sent (kind text, lead text, PRIMARY KEY (kind, lead));
CREATE TABLE subscriptions (customer text PRIMARY KEY);
INSERT INTO stock VALUES ('sku-1', 10);
INSERT INTO stats VALUES ('2026-09', 0);`

func TestProbeRanksLegacyConsumers(t *testing.T) {
	t.Parallel()
	findings := legacyFindings(t)
	var order []string
	for _, f := range idemtest.Rank(findings) {
		order = append(order, f.Consumer)
	}
	want := "invoice-creator commission-payer stock-reserver subscription-creator stats-updater audit-writer"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("ranked %q\nwant   %q (severity, then rows damaged: two invoices before one commission)", got, want)
	}
	plan := idemtest.Plan(findings)
	t.Log("\n" + plan)
	for _, line := range []string{
		"| 1 | invoice-creator | critical | second invoice, customer charged twice | invoices +2 rows | key invoice:{customer}:{period} |",
		"| 3 | stock-reserver | high | negative stock, overselling | stock.qty changed in 1 row | key {order_id}:{product_id} |",
		"| 4 | subscription-creator | high | — | redelivery fails: ",
		"| 5 | stats-updater | medium | revenue overstated | stats.revenue changed in 1 row |",
		"| 6 | audit-writer | low | duplicate log line | audit_log +1 row | key {event_id} |",
		"6 of 7 consumers not idempotent. Idempotent: email-sender.",
	} {
		if !strings.Contains(plan, line) {
			t.Errorf("plan lacks %q", line)
		}
	}
	for _, f := range findings {
		if f.Consumer == "subscription-creator" && (f.Err == nil || !f.Redelivery.Empty()) {
			t.Errorf("subscription-creator: want a failed redelivery that changed nothing, got err=%v diff=%s", f.Err, f.Redelivery)
		}
	}
}

// legacyFindings probes the legacy consumers on one shared database.
// They are written without idem, as the incident's codebase was: each commits
// on its own.
func legacyFindings(t *testing.T) []idemtest.Finding {
	t.Helper()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(context.Background(), legacyDDL); err != nil {
		t.Fatal(err)
	}
	snap := idemtest.Postgres(pool, nil)
	run := func(q string) idemtest.LegacyHandler {
		return func(ctx context.Context, _ idem.Message) error {
			_, err := pool.Exec(ctx, q)
			return err
		}
	}
	ls := []idemtest.Legacy{
		{Consumer: "audit-writer", Handler: run(`INSERT INTO audit_log VALUES ('renewed')`), Severity: idemtest.Low,
			Damage: "duplicate log line", Fix: "key {event_id}"},
		{Consumer: "stats-updater", Handler: run(`UPDATE stats SET revenue = revenue + 5000000`), Severity: idemtest.Medium,
			Damage: "revenue overstated", Fix: "recompute the month's total instead of adding"},
		{Consumer: "email-sender", Handler: run(`INSERT INTO emails_sent VALUES ('welcome', 'lead-1') ON CONFLICT DO NOTHING`), Severity: idemtest.Medium},
		{Consumer: "stock-reserver", Handler: run(`UPDATE stock SET qty = qty - 2`), Severity: idemtest.High,
			Damage: "negative stock, overselling", Fix: "key {order_id}:{product_id}"},
		{Consumer: "commission-payer", Handler: run(`INSERT INTO commissions (order_id, amount) VALUES ('o-1', 100)`), Severity: idemtest.Critical,
			Damage: "commission paid twice", Fix: "key {order_id}:{employee_id}"},
		{Consumer: "invoice-creator", Handler: run(`INSERT INTO invoices (customer, period, total) VALUES ('cus-8421', '2026-09', 2400000), ('cus-8421', '2026-08', 2400000)`),
			Severity: idemtest.Critical, Damage: "second invoice, customer charged twice", Fix: "key invoice:{customer}:{period}"},
		// A unique constraint without the catch that turns the violation into
		// success: the redelivery fails and is redelivered forever.
		{Consumer: "subscription-creator", Handler: run(`INSERT INTO subscriptions VALUES ('cus-1')`), Severity: idemtest.High},
	}
	for i := range ls {
		ls[i].Sample = idem.Message{ID: "evt-" + ls[i].Consumer}
		ls[i].Snapshot = snap
	}
	return idemtest.ProbeAll(t, ls...)
}

var known = []string{"invoice-creator", "commission-payer", "stock-reserver", "subscription-creator", "stats-updater", "audit-writer"}

func TestRatchet(t *testing.T) {
	t.Parallel()
	findings := legacyFindings(t)
	mustPass(t, func(tb testing.TB) { idemtest.Ratchet(tb, findings, known...) })

	mustFail(t, func(tb testing.TB) { idemtest.Ratchet(tb, findings, known[1:]...) },
		"invoice-creator is not idempotent (invoices +2 rows) and not on the list", "fix it rather than add it")

	mustFail(t, func(tb testing.TB) { idemtest.Ratchet(tb, findings, append(known, "email-sender")...) },
		"email-sender is idempotent now: remove it from the list")

	mustFail(t, func(tb testing.TB) { idemtest.Ratchet(tb, findings, append(known, "gone-consumer")...) },
		"gone-consumer is on the list", "was not probed")
}

func TestRatchetRejectsProbeThatProvesNothing(t *testing.T) {
	t.Parallel()
	idle := idemtest.Legacy{Consumer: "sms-sender", Sample: idem.Message{ID: "m"},
		Handler:  func(context.Context, idem.Message) error { return nil },
		Snapshot: idemtest.SnapshotFunc(func(context.Context) (*idemtest.Snapshot, error) { return &idemtest.Snapshot{}, nil })}
	f, err := idemtest.Probe(context.Background(), idle)
	if err != nil {
		t.Fatal(err)
	}
	mustFail(t, func(tb testing.TB) { idemtest.Ratchet(tb, []idemtest.Finding{f}) }, "sms-sender", "proves nothing")
	f.AllowNoEffect = true
	mustPass(t, func(tb testing.TB) { idemtest.Ratchet(tb, []idemtest.Finding{f}) })
}
