package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/pgtest"

	"github.com/idemkit/idem/internal/amqptest"
)

// checkReport asserts what the demo promises: the idem side exact, the naive
// side damaged by real redelivery.
func checkReport(t *testing.T, rep *Report, renewals int) {
	t.Helper()
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", text.String())
	i, n := rep.Idem, rep.Naive
	if i.Invoices != renewals || i.DuplicateInvoices != 0 || i.DuplicateQueryRows != 0 || i.CustomersDoubleBilled != 0 {
		t.Errorf("idem invoices: %d (want %d), duplicates %d, duplicate-query rows %d, customers double-billed %d; want none",
			i.Invoices, renewals, i.DuplicateInvoices, i.DuplicateQueryRows, i.CustomersDoubleBilled)
	}
	if i.Charges != i.Invoices || i.Charges != i.ChargesExpected || i.AmountCharged != i.AmountExpected || i.CustomersChargedTwice != 0 {
		t.Errorf("idem charges: %d for %d invoices (expected %d), amount %d (expected %d), %d customers charged twice",
			i.Charges, i.Invoices, i.ChargesExpected, i.AmountCharged, i.AmountExpected, i.CustomersChargedTwice)
	}
	if i.MerchantsOff != 0 || i.BalanceOff != 0 || i.ProductsOff != 0 || i.StockOff != 0 {
		t.Errorf("idem balances off: %d merchants by %d; stock off: %d products by %d units; want exact",
			i.MerchantsOff, i.BalanceOff, i.ProductsOff, i.StockOff)
	}
	if i.Applied != i.EventsExpected || i.DeadLettered != 0 || i.DuplicatesSkipped == 0 {
		t.Errorf("idem outcomes: applied %d of %d events, %d dead-lettered, %d duplicates skipped",
			i.Applied, i.EventsExpected, i.DeadLettered, i.DuplicatesSkipped)
	}
	if !rep.OK() {
		t.Error("Report.OK is false")
	}
	if n.CaughtByRestart == 0 || i.CaughtByRestart == 0 {
		t.Errorf("the restart caught %d naive and %d idem deliveries in flight; the scenario did not redeliver", n.CaughtByRestart, i.CaughtByRestart)
	}
	if n.DuplicateInvoices == 0 || n.DuplicateQueryRows == 0 || n.Charges <= n.ChargesExpected || n.MerchantsOff == 0 || n.ProductsOff == 0 {
		t.Errorf("naive side undamaged (duplicates %d, query rows %d, charges %d of %d, merchants off %d, products off %d): the scenario does not exercise redelivery",
			n.DuplicateInvoices, n.DuplicateQueryRows, n.Charges, n.ChargesExpected, n.MerchantsOff, n.ProductsOff)
	}
	if !rep.Damaged() {
		t.Error("Report.Damaged is false")
	}
	if !strings.Contains(text.String(), "naive: ") || !strings.Contains(text.String(), "idem: 0 rows") {
		t.Errorf("the text report lacks the duplicate-query line")
	}
}

func TestDemoSQLiteKfake(t *testing.T) {
	t.Parallel()
	var phases []string
	rep, err := Run(t.Context(), Options{Renewals: 300, Seed: 7, Progress: func(p Progress) {
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Database != "SQLite" || !strings.Contains(rep.Broker, "kfake") {
		t.Errorf("ran on %s + %s, want kfake + SQLite", rep.Broker, rep.Database)
	}
	checkReport(t, rep, 300)
	if got := strings.Join(phases, ","); !strings.HasPrefix(got, "publishing,") || !strings.HasSuffix(got, ",redelivering") {
		t.Errorf("progress phases %s; want publishing first and redelivering last", got)
	}
}

// amqpURL is the test broker: see [amqptest.URL].
func amqpURL() string { return amqptest.URL() }

func TestDemoPostgresRabbitMQ(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable (%v); start it with: rabbitmq-server -detached, or set IDEM_AMQP_URL", redact(amqpURL()), err)
	}
	_ = conn.Close()
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "t_demo_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		db, err := sql.Open("pgx", pgtest.BaseURL())
		if err != nil {
			return
		}
		defer db.Close()
		for _, s := range []string{"_naive", "_idem"} {
			if _, err := db.ExecContext(context.Background(), "DROP SCHEMA IF EXISTS "+prefix+s+" CASCADE"); err != nil {
				t.Logf("dropping schema %s: %v", prefix+s, err)
			}
		}
	})
	db, err := sql.Open("pgx", pgtest.BaseURL())
	if err == nil {
		err = db.PingContext(t.Context())
		_ = db.Close()
	}
	if err != nil {
		t.Fatalf("PostgreSQL at %s is not reachable (%v); %s", pgtest.BaseURL(), err, pgtest.FixHint)
	}
	rep, err := Run(t.Context(), Options{Renewals: 300, Seed: 7, Postgres: pgtest.BaseURL(), SchemaPrefix: prefix, RabbitMQ: amqpURL()})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Database != "PostgreSQL" || !strings.HasPrefix(rep.Broker, "RabbitMQ") || strings.Contains(rep.Broker, "guest:guest") {
		t.Errorf("ran on %s + %s, want RabbitMQ (password redacted) + PostgreSQL", rep.Broker, rep.Database)
	}
	checkReport(t, rep, 300)
}

func TestPlanIsDeterministicAndRepublishes(t *testing.T) {
	a, b := newPlan(1000, 3, 0.05), newPlan(1000, 3, 0.05)
	for _, s := range streams {
		if len(a.stream[s]) != len(b.stream[s]) {
			t.Fatalf("%s: %d then %d messages for the same seed", s, len(a.stream[s]), len(b.stream[s]))
		}
		for k := range a.stream[s] {
			if a.stream[s][k].id != b.stream[s][k].id {
				t.Fatalf("%s[%d]: %s then %s for the same seed", s, k, a.stream[s][k].id, b.stream[s][k].id)
			}
		}
	}
	if a.distinct[streamRenewals] != 1000 || a.orders != 500 {
		t.Errorf("renewals %d, orders %d; want 1000, 500", a.distinct[streamRenewals], a.orders)
	}
	total := a.distinct[streamRenewals] + a.distinct[streamPaid] + a.distinct[streamPlaced]
	if a.republished < total/40 || a.republished > total/10 {
		t.Errorf("republished %d of %d events; want about 5%%", a.republished, total)
	}
	if a.total() != total+a.republished {
		t.Errorf("published %d, want %d distinct + %d copies", a.total(), total, a.republished)
	}
	// Every copy carries the ID and body of an event published before it.
	seen := map[string]string{}
	copies := 0
	for _, s := range streams {
		for _, ev := range a.stream[s] {
			if body, ok := seen[ev.id]; ok {
				copies++
				if body != string(ev.body) {
					t.Fatalf("copy of %s has another body", ev.id)
				}
			}
			seen[ev.id] = string(ev.body)
		}
	}
	if copies != a.republished {
		t.Errorf("found %d copies, plan says %d", copies, a.republished)
	}
	var paid int64
	for _, v := range a.balances {
		paid += v
	}
	if paid != a.orderPaidTotal {
		t.Errorf("expected balances sum to %d, orders paid %d", paid, a.orderPaidTotal)
	}
	if c := newPlan(1000, 4, 0.05); c.stream[streamRenewals][0].id == a.stream[streamRenewals][0].id {
		t.Error("another seed gave the same first event ID")
	}
}

func TestOptionsRejected(t *testing.T) {
	for _, o := range []Options{{Renewals: 5}, {RabbitMQ: "amqp://x/", Kafka: []string{"k:9092"}}, {OutageHeld: 2}} {
		if _, err := Run(t.Context(), o); err == nil {
			t.Errorf("Run(%+v) accepted invalid options", o)
		}
	}
}

func TestNumberFormatting(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1247: "1,247", -890000000: "-890,000,000"} {
		if got := num(n); got != want {
			t.Errorf("num(%d) = %q, want %q", n, got, want)
		}
	}
}
