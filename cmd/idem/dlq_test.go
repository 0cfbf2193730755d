package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"

	"github.com/idemkit/idem/internal/kafkatest"

	"github.com/idemkit/idem/internal/amqptest"
	"github.com/idemkit/idem/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// dlqRun runs `idem dlq args...` and fails the test unless it exits with
// want.
func dlqRun(t *testing.T, want int, args ...string) (stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	if code := run(ctx, append([]string{"dlq"}, args...), &out, &errb); code != want {
		t.Fatalf("idem dlq %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

func testAMQPURL() string { return amqptest.URL() }

func suffix() string {
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// dlqEnv is a work queue and its DLQ holding letters as idemrabbitmq
// writes them, and an inbox in a fresh schema.
type dlqEnv struct {
	conn *amqp.Connection
	topo idemrabbitmq.Topology
	db   string
	pool *pgxpool.Pool
}

func newDLQEnv(t *testing.T) *dlqEnv {
	t.Helper()
	ctx := context.Background()
	conn, err := amqp.Dial(testAMQPURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable (%v); start it with: rabbitmq-server -detached && rabbitmqctl await_startup (or run make test), or set IDEM_AMQP_URL", testAMQPURL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, "idem-cli-dlq-"+suffix(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_ = idemrabbitmq.DeleteTopology(ch, topo)
		}
	})
	db := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &dlqEnv{conn: conn, topo: topo, db: db, pool: pool}
}

// letter puts a dead letter of message id into the DLQ, as the consumer
// billing-invoice would have.
func (e *dlqEnv) letter(t *testing.T, id, reason string, at time.Time) {
	t.Helper()
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	c, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.topo.DeadLetterQueue, true, false, amqp.Publishing{
		MessageId: id, Timestamp: at, DeliveryMode: amqp.Persistent, ContentType: "application/json",
		Body: []byte(`{"invoice":"` + id + `"}`),
		Headers: amqp.Table{"tenant": "acme", "x-idem-reason": reason, "x-idem-outcome": "dead_lettered",
			"x-idem-consumer": "billing-invoice", "x-idem-attempts": int64(3), "x-idem-origin": e.topo.Queue},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.WaitContext(context.Background()); !ok || err != nil {
		t.Fatalf("confirm %v %v", ok, err)
	}
}

func (e *dlqEnv) depth(t *testing.T, q string) int {
	t.Helper()
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return info.Messages
}

// The operator's session on RabbitMQ: list, show, a dry run, a redrive by
// ID, a replay with its audit row, a refused expired letter, a purge.
func TestDLQCommandsRabbitMQ(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newDLQEnv(t)
	now := time.Now()
	e.letter(t, "inv-1", "handling message inv-1: permanent: tax rate missing for region", now.Add(-time.Hour))
	e.letter(t, "inv-2", "handling message inv-2: permanent: tax rate missing for region", now.Add(-time.Minute))
	e.letter(t, "inv-3", "handling message inv-3: permanent: customer unknown", now)
	e.letter(t, "inv-old", "message older than the inbox retention window", now.Add(-30*24*time.Hour))
	q := []string{"--queue", e.topo.DeadLetterQueue}
	withDB := append([]string{"--database", e.db, "--key", "id"}, q...)

	out, _ := dlqRun(t, 0, append([]string{"list", "--json"}, q...)...)
	var ls struct {
		Total  int
		Groups []struct {
			Reason, Consumer string
			Count            int
			IDs              []string
		}
	}
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if ls.Total != 4 || len(ls.Groups) != 3 || ls.Groups[0].Count != 2 || ls.Groups[0].Reason != "handling message <id>: permanent: tax rate missing for region" || ls.Groups[0].Consumer != "billing-invoice" {
		t.Fatalf("list: %+v", ls)
	}
	out, _ = dlqRun(t, 0, append([]string{"list"}, q...)...)
	if !strings.Contains(out, "4 dead letters") || !strings.Contains(out, "inv-1,inv-2") {
		t.Fatalf("list: %s", out)
	}

	out, _ = dlqRun(t, 0, append([]string{"show", "--id", "inv-1"}, withDB...)...)
	for _, want := range []string{"verdict", "apply: consumer billing-invoice has no marker", "tenant: acme", `{"invoice":"inv-1"}`, "redrive to  " + e.topo.Queue} {
		if !strings.Contains(out, want) {
			t.Fatalf("show lacks %q:\n%s", want, out)
		}
	}
	dlqRun(t, 1, append([]string{"show", "--id", "inv-404"}, withDB...)...)
	out, _ = dlqRun(t, 0, append([]string{"show", "--id", "inv-2", "--json"}, withDB...)...)
	var sh struct {
		Letter struct {
			ID, Consumer, Target string
			TimeFrom             string `json:"time_from"`
			Attempts             int
		}
		Judgement struct {
			Verdict  string
			InboxKey string `json:"inbox_key"`
		}
	}
	if err := json.Unmarshal([]byte(out), &sh); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if sh.Letter.ID != "inv-2" || sh.Letter.TimeFrom != "broker" || sh.Letter.Attempts != 3 || sh.Letter.Target != e.topo.Queue || sh.Judgement.Verdict != "apply" || sh.Judgement.InboxKey != "inv-2" {
		t.Fatalf("show --json: %s", out)
	}

	// The dry run changes nothing, and says the expired one would be refused.
	out, _ = dlqRun(t, 1, append([]string{"redrive"}, withDB...)...)
	if !strings.Contains(out, "dry run: 4 letters match") || !strings.Contains(out, "1 would be refused") {
		t.Fatalf("dry run: %s", out)
	}
	if d, n := e.depth(t, e.topo.DeadLetterQueue), e.depth(t, e.topo.Queue); d != 4 || n != 0 {
		t.Fatalf("after the dry run: DLQ %d, queue %d", d, n)
	}

	out, _ = dlqRun(t, 0, append([]string{"redrive", "--apply", "--id", "inv-1,inv-2", "--json"}, withDB...)...)
	var res struct {
		DryRun        bool `json:"dry_run"`
		Matched, Done int
		Items         []struct {
			ID      string
			Done    bool
			Retired *struct {
				ID        int64
				RetiredBy string `json:"retired_by"`
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.DryRun || res.Matched != 2 || res.Done != 2 {
		t.Fatalf("redrive: %s", out)
	}
	if d, n := e.depth(t, e.topo.DeadLetterQueue), e.depth(t, e.topo.Queue); d != 2 || n != 2 {
		t.Fatalf("after the redrive: DLQ %d, queue %d", d, n)
	}

	// inv-3 was applied meanwhile (a marker exists): show says duplicate;
	// a replay needs --why, then retires the marker and redrives.
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('billing-invoice', 'inv-3', 'inv-3', '\x00')`); err != nil {
		t.Fatal(err)
	}
	out, _ = dlqRun(t, 0, append([]string{"show", "--id", "inv-3"}, withDB...)...)
	if !strings.Contains(out, "duplicate: consumer billing-invoice has a marker") {
		t.Fatalf("show: %s", out)
	}
	dlqRun(t, 2, append([]string{"replay", "--id", "inv-3", "--apply"}, withDB...)...)
	dlqRun(t, 2, append([]string{"replay", "--why", "INC-7", "--apply"}, withDB...)...)
	out, _ = dlqRun(t, 0, append([]string{"replay", "--id", "inv-3", "--why", "INC-7: invoice voided by hand", "--by", "alice"}, withDB...)...)
	if !strings.Contains(out, "dry run: 1 letters match") {
		t.Fatalf("dry replay: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"replay", "--id", "inv-3", "--why", "INC-7: invoice voided by hand", "--by", "alice", "--apply", "--json"}, withDB...)...)
	res.Items = nil
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.Done != 1 || res.Items[0].Retired == nil || res.Items[0].Retired.RetiredBy != "alice" {
		t.Fatalf("replay: %s", out)
	}
	var markers, audit int
	var why string
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idem_inbox), (SELECT count(*) FROM idem_inbox_retired), (SELECT why FROM idem_inbox_retired)`).Scan(&markers, &audit, &why); err != nil {
		t.Fatal(err)
	}
	if markers != 0 || audit != 1 || why != "INC-7: invoice voided by hand" {
		t.Fatalf("markers %d, audit rows %d (%q)", markers, audit, why)
	}

	// Only the expired one is left: refused without --expired (exit 1).
	out, errOut := dlqRun(t, 1, append([]string{"redrive", "--apply"}, withDB...)...)
	if !strings.Contains(out, "expire") || !strings.Contains(errOut, "1 letters refused") {
		t.Fatalf("expired: %s\n%s", out, errOut)
	}
	if d := e.depth(t, e.topo.DeadLetterQueue); d != 1 {
		t.Fatalf("DLQ %d after a refusal", d)
	}

	// Purge: a dry run, then for good.
	out, _ = dlqRun(t, 0, append([]string{"purge"}, q...)...)
	if !strings.Contains(out, "dry run: 1 letters match") || e.depth(t, e.topo.DeadLetterQueue) != 1 {
		t.Fatalf("dry purge: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"purge", "--apply", "--reason", "retention window"}, q...)...)
	if !strings.Contains(out, "purged 1 of 1") || e.depth(t, e.topo.DeadLetterQueue) != 0 {
		t.Fatalf("purge: %s", out)
	}
	if n := e.depth(t, e.topo.Queue); n != 3 {
		t.Fatalf("queue holds %d, want the 3 redriven", n)
	}
}

func TestDLQUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"list"},
		{"list", "--queue", "a", "--topic", "b"},
		{"list", "--topic", "b", "--brokers", ""},
		{"redrive", "--queue", "a", "--since", "yesterday"},
		{"redrive", "--queue", "a", "--rate", "-1"},
		{"show", "--queue", "a"},
		{"replay", "--queue", "a", "--why", "x"},
		{"show", "--queue", "a", "--id", "x", "--at", "#1"}, // two selectors
		{"show", "--queue", "a", "--id", "x", "--key", ""},  // an empty key
		{"redrive", "--queue", "a", "--key", "body"},        // no such key spec
		{"replay", "--queue", "a", "--key", "json:invoice"}, // not a JSON pointer
		{"show", "--queue", "a", "--id", "x", "--key", "id", "--max-ahead", "2h"},
		{"redrive", "--queue", "a", "--key", "id", "--id", ","},
		{"redrive", "--queue", "a", "--key", "id", "--reason", ""},
		{"purge", "--queue", "a", "--consumer", " "},
		{"frobnicate"},
	} {
		if args[0] == "list" && len(args) == 4 && os.Getenv("IDEM_KAFKA_BROKERS") != "" {
			continue
		}
		dlqRun(t, 2, args...)
	}
	out, _ := dlqRun(t, 2, "list", "--json")
	var e struct {
		Error string
		Exit  int
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.Exit != 2 {
		t.Fatalf("--json usage error: %q %v", out, err)
	}
	out, _ = dlqRun(t, 0, "ddl", "--table", "billing.inbox")
	if !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "billing"."idem_inbox_retired"`) || !strings.Contains(out, "retired_by") {
		t.Fatalf("ddl: %s", out)
	}
	dlqRun(t, 2, "ddl", "--table", "a.b.c")
	out, _ = dlqRun(t, 0, "-h")
	if !strings.Contains(out, "replay") {
		t.Fatalf("help: %s", out)
	}
}

// Kafka: list and a redrive of a dead-letter topic on kfake.
func TestDLQCommandsKafka(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := kafkatest.NewCluster(t)
	brokers := strings.Join(c.ListenAddrs(), ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tn := range []string{"orders", "orders.dlq"} {
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, tn); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"ord-1", "ord-2"} {
		r := idemkafka.NewRecord("orders.dlq", id, []byte(id), []byte(`{}`))
		r.Headers = append(r.Headers,
			kgo.RecordHeader{Key: "x-idem-reason", Value: []byte("carrier unknown")},
			kgo.RecordHeader{Key: "x-idem-consumer", Value: []byte("orders-ship")},
			kgo.RecordHeader{Key: "x-idem-attempts", Value: []byte("1")},
			kgo.RecordHeader{Key: "x-idem-origin", Value: []byte("orders/0/7")})
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	db := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	k := []string{"--topic", "orders.dlq", "--brokers", brokers}
	out, _ := dlqRun(t, 0, append([]string{"list"}, k...)...)
	if !strings.Contains(out, "kafka topic orders.dlq: 2 dead letters") || !strings.Contains(out, "carrier unknown") {
		t.Fatalf("list: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"redrive", "--apply", "--database", db, "--key", "id"}, k...)...)
	if !strings.Contains(out, "redriven 2 of 2") {
		t.Fatalf("redrive: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"list"}, k...)...)
	if !strings.Contains(out, "0 dead letters") {
		t.Fatalf("list after redrive: %s", out)
	}
	end, err := kadm.NewClient(cl).ListEndOffsets(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := end.Lookup("orders", 0); o.Offset != 2 {
		t.Fatalf("orders holds %d records, want the 2 redriven", o.Offset)
	}
}

// A filter given empty (an unset shell variable: --id "$ID") is a usage
// error, not a selection of every letter: the DLQ keeps them all.
func TestDLQEmptyFilterIsUsageError(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	for _, id := range []string{"inv-1", "inv-2", "inv-3"} {
		e.letter(t, id, "boom", time.Now())
	}
	for d := e.depth(t, e.topo.DeadLetterQueue); d != 3; d = e.depth(t, e.topo.DeadLetterQueue) {
		time.Sleep(10 * time.Millisecond)
	}
	_, errOut := dlqRun(t, 2, "purge", "--apply", "--id", "", "--queue", e.topo.DeadLetterQueue)
	if !strings.Contains(errOut, "--id is empty") {
		t.Errorf("stderr: %s", errOut)
	}
	if d := e.depth(t, e.topo.DeadLetterQueue); d != 3 {
		t.Fatalf("purge --apply --id '': the DLQ holds %d, want the 3 letters", d)
	}
}

// The key the consumer claims decides the verdict: a consumer keyed by
// invoice skips a letter whose invoice has a marker written by another
// message. --key names that key; judged by message ID the same letter
// would be applied. A replay with it retires that marker.
func TestDLQBusinessKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newDLQEnv(t)
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('billing-invoice', 'invoice:inv-a', 'inv-b', '\x00')`); err != nil {
		t.Fatal(err)
	}
	e.letter(t, "inv-a", "boom", time.Now()) // body {"invoice":"inv-a"}
	for d := e.depth(t, e.topo.DeadLetterQueue); d != 1; d = e.depth(t, e.topo.DeadLetterQueue) {
		time.Sleep(10 * time.Millisecond)
	}
	q := []string{"--database", e.db, "--queue", e.topo.DeadLetterQueue}
	byInvoice := append([]string{"--key", "template:invoice:{/invoice}"}, q...)
	out, _ := dlqRun(t, 0, append([]string{"show", "--id", "inv-a", "--json"}, byInvoice...)...)
	var sh struct {
		Judgement struct {
			Verdict  string `json:"verdict"`
			InboxKey string `json:"inbox_key"`
		} `json:"judgement"`
	}
	if err := json.Unmarshal([]byte(out), &sh); err != nil || sh.Judgement.Verdict != "duplicate" || sh.Judgement.InboxKey != "invoice:inv-a" {
		t.Fatalf("show by invoice: %v %s", err, out)
	}
	out, _ = dlqRun(t, 0, append([]string{"show", "--id", "inv-a", "--json", "--key", "id"}, q...)...)
	if !strings.Contains(out, `"verdict":"apply"`) {
		t.Fatalf("show by message ID: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"replay", "--id", "inv-a", "--why", "INC-3", "--by", "alice", "--apply"}, byInvoice...)...)
	if !strings.Contains(out, "replayed 1 of 1") {
		t.Fatalf("replay: %s", out)
	}
	var markers int
	var retired string
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idem_inbox), (SELECT message_id FROM idem_inbox_retired WHERE key = 'invoice:inv-a')`).Scan(&markers, &retired); err != nil || markers != 0 || retired != "inv-b" {
		t.Fatalf("after the replay: markers %d, retired %q (%v); want 0 and the marker of inv-b", markers, retired, err)
	}
}

// With --json, a run that fails part-way prints one JSON document on
// stdout: the error object, which says what was done before the failure.
func TestDLQJSONOneDocumentOnFailure(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	e.letter(t, "inv-1", "boom", time.Now())
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	// A second letter whose origin queue is gone: its republish is returned.
	if err := ch.PublishWithContext(context.Background(), "", e.topo.DeadLetterQueue, false, false, amqp.Publishing{
		MessageId: "inv-2", Timestamp: time.Now(), DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
		Headers: amqp.Table{"x-idem-reason": "boom", "x-idem-consumer": "billing-invoice", "x-idem-origin": e.topo.Queue + ".gone"},
	}); err != nil {
		t.Fatal(err)
	}
	for d := e.depth(t, e.topo.DeadLetterQueue); d != 2; d = e.depth(t, e.topo.DeadLetterQueue) {
		time.Sleep(10 * time.Millisecond)
	}
	out, _ := dlqRun(t, 3, "redrive", "--apply", "--json", "--key", "id", "--database", e.db, "--queue", e.topo.DeadLetterQueue)
	d := json.NewDecoder(strings.NewReader(out))
	var doc struct {
		Error string `json:"error"`
		Exit  int    `json:"exit"`
	}
	if err := d.Decode(&doc); err != nil || doc.Exit != 3 {
		t.Fatalf("stdout %q: %v", out, err)
	}
	if d.More() {
		t.Fatalf("more than one JSON document on stdout:\n%s", out)
	}
	if !strings.Contains(doc.Error, "could not route") || !strings.Contains(doc.Error, "left the DLQ: inv-1") {
		t.Errorf("error %q: want the failure and what was done before it", doc.Error)
	}
}

// On Kafka a letter behind a kept one cannot leave the topic: a purge or
// redrive of it that leaves it there exits 1, not 0.
func TestDLQKafkaLetterThatStaysExits1(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := kafkatest.NewCluster(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tn := range []string{"orders", "orders.dlq"} {
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, tn); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"ord-1", "ord-2"} {
		r := idemkafka.NewRecord("orders.dlq", id, []byte(id), []byte(`{}`))
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "x-idem-reason", Value: []byte("carrier unknown")},
			kgo.RecordHeader{Key: "x-idem-consumer", Value: []byte("orders-ship")}, kgo.RecordHeader{Key: "x-idem-origin", Value: []byte("orders/0/7")})
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	db := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	k := []string{"--topic", "orders.dlq", "--brokers", strings.Join(c.ListenAddrs(), ",")}
	_, errOut := dlqRun(t, 1, append([]string{"purge", "--apply", "--id", "ord-2"}, k...)...)
	if !strings.Contains(errOut, "1 matching letters are still in the DLQ") {
		t.Errorf("purge: stderr %s", errOut)
	}
	dlqRun(t, 1, append([]string{"redrive", "--apply", "--id", "ord-2", "--key", "id", "--database", db}, k...)...)
	out, _ := dlqRun(t, 0, append([]string{"list"}, k...)...)
	if !strings.Contains(out, "2 dead letters") {
		t.Fatalf("list: %s", out)
	}
}

// show cuts a long body unless --full (a 20 MB body must not flood the
// terminal), --json prints it whole, and --at shows a letter without a
// message ID; the judging flags default to the message ID as the key.
func TestDLQShowBodyAndPosition(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 20<<20/16)
	for _, p := range []amqp.Publishing{
		{MessageId: "inv-big", Body: big, Headers: amqp.Table{"x-idem-reason": "too big", "x-idem-consumer": "billing-invoice", "x-idem-origin": e.topo.Queue}},
		{Body: []byte(`{"no":"id"}`), Headers: amqp.Table{"x-idem-reason": "no id", "x-idem-consumer": "billing-invoice", "x-idem-origin": e.topo.Queue}},
	} {
		p.DeliveryMode = amqp.Persistent
		c, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.topo.DeadLetterQueue, true, false, p)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("confirm %v %v", ok, err)
		}
	}
	q := []string{"--database", e.db, "--queue", e.topo.DeadLetterQueue}
	out, _ := dlqRun(t, 0, append([]string{"show", "--id", "inv-big"}, q...)...)
	if len(out) > 8<<10 || !strings.Contains(out, fmt.Sprintf("… %d more bytes (--full", len(big)-bodyShown)) || !strings.Contains(out, "inbox key   inv-big") {
		t.Fatalf("show of a 20 MB body printed %d bytes:\n%.2000s", len(out), out)
	}
	out, _ = dlqRun(t, 0, append([]string{"show", "--id", "inv-big", "--full"}, q...)...)
	if !strings.Contains(out, string(big)) || strings.Contains(out, "more bytes") {
		t.Fatalf("show --full printed %d bytes, want the whole body", len(out))
	}
	out, _ = dlqRun(t, 0, append([]string{"show", "--id", "inv-big", "--json"}, q...)...)
	var sh struct{ Letter struct{ Body []byte } }
	if err := json.Unmarshal([]byte(out), &sh); err != nil || !bytes.Equal(sh.Letter.Body, big) {
		t.Fatalf("show --json: %v, body of %d bytes", err, len(sh.Letter.Body))
	}
	out, _ = dlqRun(t, 0, append([]string{"show", "--at", "#2"}, q...)...)
	if !strings.Contains(out, `{"no":"id"}`) || !strings.Contains(out, "message     -") || !strings.Contains(out, "invalid") {
		t.Fatalf("show --at #2:\n%s", out)
	}
	dlqRun(t, 1, append([]string{"show", "--at", "#3"}, q...)...)
	// The selectors of list and redrive select for show and list too: a
	// letter without an ID is shown by its reason.
	out, _ = dlqRun(t, 0, append([]string{"show", "--reason", "no id"}, q...)...)
	if !strings.Contains(out, `{"no":"id"}`) || !strings.Contains(out, "message     -") {
		t.Fatalf("show --reason:\n%s", out)
	}
	dlqRun(t, 1, append([]string{"show", "--reason", "no such reason"}, q...)...)
	out, _ = dlqRun(t, 0, "list", "--queue", e.topo.DeadLetterQueue, "--reason", "no id")
	if !strings.Contains(out, ": 1 dead letters") || strings.Contains(out, "too big") {
		t.Fatalf("list --reason:\n%s", out)
	}
}

// NATS JetStream: list, show and a redrive of a dead-letter stream on an
// embedded server; reading leaves the letters where they are, a redrive
// publishes each to its subject and deletes it from the stream.
func TestDLQCommandsNATS(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, js := natsLetters(t, ctx)
	db := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	dlqRun(t, 2, "list", "--stream", "ORDERS_DLQ", "--queue", "q")
	k := []string{"--stream", "ORDERS_DLQ", "--nats", srv.URL()}
	out, _ := dlqRun(t, 0, append([]string{"list"}, k...)...)
	if !strings.Contains(out, "nats stream ORDERS_DLQ: 2 dead letters") || !strings.Contains(out, "carrier unknown") {
		t.Fatalf("list: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"show", "--id", "ord-2", "--database", db, "--key", "id"}, k...)...)
	if !strings.Contains(out, "ORDERS_DLQ at #2") || !strings.Contains(out, "orders.new") || !strings.Contains(out, "apply") {
		t.Fatalf("show: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"redrive", "--apply", "--database", db, "--key", "id"}, k...)...)
	if !strings.Contains(out, "redriven 2 of 2") {
		t.Fatalf("redrive: %s", out)
	}
	out, _ = dlqRun(t, 0, append([]string{"list"}, k...)...)
	if !strings.Contains(out, "0 dead letters") {
		t.Fatalf("list after redrive: %s", out)
	}
	s, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("ORDERS holds %d messages, want the 2 redriven", info.State.Msgs)
	}
	last, err := s.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if last.Subject != "orders.new" || last.Header.Get("Nats-Msg-Id") != "ord-2" || last.Header.Get("x-idem-redriven") != "1" || last.Header.Get("x-idem-reason") != "" {
		t.Fatalf("redriven message %s %v", last.Subject, last.Header)
	}
}

// natsLetters starts a JetStream server with streams ORDERS (orders.>) and
// ORDERS_DLQ holding two dead letters, ord-1 and ord-2, as idemnats writes
// them.
func natsLetters(t *testing.T, ctx context.Context) (*natstest.Server, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Start(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range []jetstream.StreamConfig{
		{Name: "ORDERS", Subjects: []string{"orders.>"}},
		{Name: "ORDERS_DLQ", Subjects: []string{"idem.dlq.ORDERS"}},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range []string{"ord-1", "ord-2"} {
		m := &nats.Msg{Subject: "idem.dlq.ORDERS", Data: []byte(`{}`), Header: nats.Header{}}
		m.Header.Set("Nats-Msg-Id", id)
		m.Header.Set("x-idem-reason", "carrier unknown")
		m.Header.Set("x-idem-consumer", "orders-ship")
		m.Header.Set("x-idem-attempts", "1")
		m.Header.Set("x-idem-origin", fmt.Sprintf("ORDERS/%d", i+7))
		m.Header.Set("x-idem-subject", "orders.new")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	return srv, js
}
