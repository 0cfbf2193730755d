package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/pgxinbox"
)

// reconcileEnv is a schema with an inbox and an outbox whose five rows
// were sent; the consumer billing applied the first three.
type reconcileEnv struct {
	url  string
	pool *pgxpool.Pool
	proc *idem.Processor[pgx.Tx]
	ids  []string
	rows []outbox.Record
}

func newReconcileEnv(t *testing.T) *reconcileEnv {
	t.Helper()
	ctx := context.Background()
	e := &reconcileEnv{url: pgtest.Schema(t)}
	pool, err := pgxpool.New(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.pool = pool
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.NewPgx(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{Destination: "orders", Body: []byte{byte('a' + i)}})
	}
	if e.ids, err = ob.Enqueue(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idem_outbox SET sent_at = now()`); err != nil {
		t.Fatal(err)
	}
	if e.rows, err = ob.SentRows(ctx, outbox.SentFilter{}); err != nil || len(e.rows) != 5 {
		t.Fatalf("sent rows %v: %v", e.rows, err)
	}
	e.proc, err = idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "billing", Key: idem.ByMessageID, Logger: slog.New(slog.DiscardHandler),
		Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	e.apply(t, 0, 3)
	return e
}

// apply lets the consumer apply rows from..to-1.
func (e *reconcileEnv) apply(t *testing.T, from, to int) {
	t.Helper()
	for _, r := range e.rows[from:to] {
		if res := e.proc.Process(context.Background(), idem.Message{ID: r.ID, Body: r.Body, Time: r.EventTime, TimeSource: idem.TimeFromID}); res.Outcome != idem.Applied {
			t.Fatalf("applying %s: %s %v", r.ID, res.Outcome, res.Err)
		}
	}
}

// reconcileJSON is what idem reconcile --json prints.
type reconcileJSON struct {
	Consumer string         `json:"consumer"`
	Checked  int            `json:"checked"`
	Counts   map[string]int `json:"counts"`
	Missing  []struct {
		ID       string    `json:"id"`
		Time     time.Time `json:"time"`
		Position string    `json:"position"`
		Status   string    `json:"status"`
	} `json:"missing"`
	Repaired *struct {
		Sent []string `json:"sent"`
	} `json:"repaired"`
	Audit *int64 `json:"audit_id"`
}

func parseReconcile(t *testing.T, r cliResult) reconcileJSON {
	t.Helper()
	var out reconcileJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("stdout %q: %v", r.stdout, err)
	}
	return out
}

func (o reconcileJSON) missing() []string {
	var ids []string
	for _, m := range o.Missing {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestReconcileCommand: idem reconcile exits 1 and lists the missing
// messages by ID, time and position; 0 once the consumer applied them; 2
// for a bad command line, a repair from an ID file among them; 3 when the
// inbox cannot be read. A repair redelivers exactly the missing messages
// to the consumer's queue, each confirmed, and records the run in the
// audit table.
func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	e := newReconcileEnv(t)
	base := []string{"reconcile", "--database", e.url, "--consumer", "billing", "--from", "1h", "--settle", "0s"}
	with := func(extra ...string) []string { return append(slices.Clone(base), extra...) }
	want := slices.Sorted(slices.Values(e.ids[3:]))

	args := with("--source", "outbox", "--destination", "orders", "--json")
	r := cli(t, args...)
	r.expect(t, exitFindings, args)
	out := parseReconcile(t, r)
	if got := out.missing(); !slices.Equal(got, want) || out.Checked != 5 || out.Counts["applied"] != 3 || out.Consumer != "billing" {
		t.Fatalf("missing %v of %d checked (counts %v), want %v of 5", got, out.Checked, out.Counts, want)
	}
	for _, m := range out.Missing {
		if m.Time.IsZero() || !strings.HasPrefix(m.Position, "seq ") || m.Status != "missing" {
			t.Fatalf("finding %+v: want its time, position and status", m)
		}
	}
	args = with("--source", "outbox")
	if r := cli(t, args...); r.code != exitFindings || !strings.Contains(r.stdout, "MISSING consumer billing") || !strings.Contains(r.stdout, e.ids[4]) {
		t.Fatalf("idem %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}

	// An ID file: the applied IDs and one the consumer never saw.
	file := filepath.Join(t.TempDir(), "ids.txt")
	if err := os.WriteFile(file, []byte(strings.Join(append(slices.Clone(e.ids[:3]), "pay-1 "+time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)), "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	args = with("--source", "ids", "--ids", file, "--json")
	r = cli(t, args...)
	r.expect(t, exitFindings, args)
	if got := parseReconcile(t, r).missing(); !slices.Equal(got, []string{"pay-1"}) {
		t.Fatalf("ID file: missing %v, want [pay-1]", got)
	}

	// Usage errors, exit 2; nothing runs.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"reconcile", "--source", "outbox"}, "--consumer is required"},
		{with("--source", "mail"), `--source "mail": want outbox, kafka or ids`},
		{with("--source", "ids", "--ids", file, "--repair", "--queue", "q"), "carries no payload"},
		{with("--source", "outbox", "--repair"), "--repair needs the consumer's own --queue"},
		{with("--source", "kafka"), "--source kafka needs --topic"},
		{with("--source", "outbox", "--to", "yesterday"), `--to "yesterday": want an RFC 3339 time`},
		{with("--source", "outbox", "--from-offset", "3"), "--from-offset and --to-offset are for --source kafka"},
	} {
		r := cli(t, tc.args...)
		r.expect(t, exitUsage, tc.args)
		if !strings.Contains(r.stderr, tc.want) {
			t.Fatalf("idem %s: stderr %q, want %q", strings.Join(tc.args, " "), r.stderr, tc.want)
		}
	}
	// The inbox cannot be read: exit 3.
	args = with("--source", "outbox", "--table", "nosuch_inbox", "--json")
	r = cli(t, args...)
	r.expect(t, exitRuntime, args)
	if je := parseJSONError(t, r, args); je.Exit != exitRuntime || je.Command != "reconcile" {
		t.Fatalf("JSON error %+v", je)
	}

	// Repair to the consumer's queue: exactly the two missing, confirmed,
	// recorded.
	conn, err := amqp.Dial(testAMQPURL())
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	suffix := make([]byte, 4)
	_, _ = crand.Read(suffix)
	q := "reconcile-cli-" + hex.EncodeToString(suffix)
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	args = with("--source", "outbox", "--destination", "orders", "--repair", "--queue", q, "--amqp", testAMQPURL(), "--by", "ops", "--why", "failover drill", "--json")
	r = cli(t, args...)
	r.expect(t, exitFindings, args)
	out = parseReconcile(t, r)
	if out.Repaired == nil || !slices.Equal(slices.Sorted(slices.Values(out.Repaired.Sent)), want) || out.Audit == nil {
		t.Fatalf("repair: %s", r.stdout)
	}
	var got []string
	for range want {
		var d amqp.Delivery
		deadline := time.Now().Add(time.Minute)
		for {
			var ok bool
			if d, ok, err = ch.Get(q, true); err != nil {
				t.Fatal(err)
			} else if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("queue %s: the redelivered messages did not arrive", q)
			}
			time.Sleep(20 * time.Millisecond)
		}
		got = append(got, d.MessageId)
	}
	if slices.Sort(got); !slices.Equal(got, want) {
		t.Fatalf("queue got %v, want %v", got, want)
	}
	var by, op string
	var ids []string
	if err := e.pool.QueryRow(context.Background(), `SELECT by, op, ids FROM idem_dlq_actions WHERE id = $1`, *out.Audit).Scan(&by, &op, &ids); err != nil {
		t.Fatal(err)
	}
	if slices.Sort(ids); by != "ops" || op != "reconcile-repair" || !slices.Equal(ids, want) {
		t.Fatalf("audit row: by %q op %q ids %v", by, op, ids)
	}

	// As a job: the gauge says 2 missing until the consumer applies them.
	watchReconcile(t, with("--source", "outbox", "--destination", "orders", "--every", "50ms", "--listen", "127.0.0.1:0"), "2")

	// The consumer applies them: nothing missing, exit 0.
	e.apply(t, 3, 5)
	args = with("--source", "outbox", "--destination", "orders")
	if r := cli(t, args...); r.code != exitOK || !strings.Contains(r.stdout, "OK consumer billing") || !strings.Contains(r.stdout, "5 checked, 0 missing, 5 applied") {
		t.Fatalf("idem %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
}

// lockedBuffer is a buffer written by a command running in the background.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var metricsAddr = regexp.MustCompile(`metrics on (http://\S+/metrics)`)

// watchReconcile runs idem reconcile --every in the background until its
// /metrics serves idem_reconcile_missing{consumer="billing"} as want, then
// stops it with its context, as SIGTERM does, and expects exit 0.
func watchReconcile(t *testing.T, args []string, want string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb lockedBuffer
	code := make(chan int, 1)
	go func() { code <- run(ctx, args, &out, &errb) }()
	line := `idem_reconcile_missing{consumer="billing"} ` + want
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if m := metricsAddr.FindStringSubmatch(errb.String()); m != nil {
			if resp, err := http.Get(m[1]); err == nil {
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if strings.Contains(string(body), line) && strings.Contains(string(body), "idem_reconcile_last_run_timestamp_seconds{consumer=\"billing\"}") {
					break
				}
			}
		}
		select {
		case c := <-code:
			t.Fatalf("idem %s exited %d before serving %s\nstdout: %s\nstderr: %s", strings.Join(args, " "), c, line, out.String(), errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("idem %s: /metrics never served %s\nstderr: %s", strings.Join(args, " "), line, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if c := <-code; c != exitOK {
		t.Fatalf("idem %s stopped with exit %d, want 0\nstderr: %s", strings.Join(args, " "), c, errb.String())
	}
}

// TestReconcileCommandKafka: against a Kafka topic, idem reconcile reports
// the records whose markers the consumer lacks and --repair produces
// exactly those again to the topic; once the consumer applied them the
// check exits 0, the copies judged applied too.
func TestReconcileCommandKafka(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newReconcileEnv(t)
	k := kafkatest.NewCluster(t)
	brokers := strings.Join(k.ListenAddrs(), ",")
	kafkatest.CreateTopics(t, k.ListenAddrs(), 2, "invoices")
	prod := kafkatest.Client(t, k.ListenAddrs(), kafkapub.ProducerOptions()...)
	pub, err := kafkapub.New(prod, nil)
	if err != nil {
		t.Fatal(err)
	}
	recs := slices.Clone(e.rows)
	for i := range recs {
		recs[i].Destination = "invoices"
	}
	for i, err := range pub.Publish(ctx, recs) {
		if err != nil {
			t.Fatalf("producing %s: %v", recs[i].ID, err)
		}
	}
	want := slices.Sorted(slices.Values(e.ids[3:]))
	base := []string{"reconcile", "--database", e.url, "--consumer", "billing", "--from", "1h", "--settle", "0s", "--source", "kafka", "--topic", "invoices", "--brokers", brokers, "--json"}
	args := append(slices.Clone(base), "--repair", "--by", "ops")
	r := cli(t, args...)
	r.expect(t, exitFindings, args)
	out := parseReconcile(t, r)
	if got := out.missing(); !slices.Equal(got, want) || out.Checked != 5 || out.Repaired == nil || !slices.Equal(slices.Sorted(slices.Values(out.Repaired.Sent)), want) {
		t.Fatalf("missing %v, checked %d, repaired %+v: want %v of 5, repaired", got, out.Checked, out.Repaired, want)
	}
	e.apply(t, 3, 5)
	r = cli(t, base...)
	r.expect(t, exitOK, base)
	if out := parseReconcile(t, r); out.Checked != 7 || out.Counts["applied"] != 7 {
		t.Fatalf("after the repair: checked %d, counts %v; want the 5 records and the 2 copies applied", out.Checked, out.Counts)
	}
	// The offsets bound the read: the records have one (empty) key, so one
	// partition holds them, and offsets 5 and 6 are the two copies.
	args = append(slices.Clone(base), "--from-offset", "5", "--to-offset", "7")
	if r := cli(t, args...); r.code != exitOK || parseReconcile(t, r).Checked != 2 {
		t.Fatalf("idem %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
}
