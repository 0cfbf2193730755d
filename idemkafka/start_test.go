package idemkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// bareTopic creates a topic with n partitions and no dead-letter topic.
func (e *kafkaEnv) bareTopic(t testing.TB, name string, n int32) string {
	t.Helper()
	name = name + "-" + e.suffix
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(e.client(t)).CreateTopic(ctx, n, 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", name, err)
	}
	return name
}

// runOnce runs c until it returns or d passes.
func runOnce[TTx any](t testing.TB, c *idemkafka.Consumer[TTx], d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.Run(ctx)
}

// A consumer whose dead letters would have nowhere to go refuses to start,
// and names the topic: it takes no record, so none is applied ahead of a
// dead letter that would hold its partition.
func TestRunRefusesMissingDeadLetterTopic(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.bareTopic(t, "nodlq", 2)
	produce(t, k.client(t), topic, 2, 0, 4, msgID)
	d := newDB(t)
	out := newOutcomes()
	c, err := idemkafka.NewConsumer(k.groupClient(t, k.group("nodlq"), []string{topic}), d.processor(t, out, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = runOnce(t, c, 30*time.Second)
	if !errors.Is(err, idemkafka.ErrDeadLetterTopic) {
		t.Fatalf("Run = %v, want ErrDeadLetterTopic", err)
	}
	if msg := err.Error(); !strings.Contains(msg, topic+".dlq") {
		t.Errorf("Run's error %q does not name %s.dlq", msg, topic)
	}
	if rows, _ := d.effects(t); rows != 0 || c.Stats().Delivered != 0 {
		t.Errorf("a consumer that refused to start applied %d records, took %d", rows, c.Stats().Delivered)
	}
	// Its client is the caller's, still open: it has left the group, so no
	// partition waits for it.
	groups, err := kadm.NewClient(k.client(t)).DescribeGroups(context.Background(), k.group("nodlq"))
	if err != nil {
		t.Fatal(err)
	}
	if g := groups[k.group("nodlq")]; len(g.Members) != 0 {
		t.Errorf("the refused consumer's client is still one of the group's %d members", len(g.Members))
	}
}

// With CreateDeadLetterTopics, Run creates the missing dead-letter topic
// with the partitions of the topic it serves, and dead letters land there.
func TestRunCreatesDeadLetterTopic(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.bareTopic(t, "mkdlq", 3)
	produce(t, k.client(t), topic, 1, 0, 1, func(int) string { return "bad" })
	d := newDB(t)
	handler := func(context.Context, pgx.Tx, idem.Message) error {
		return idem.Permanent(errors.New("no such customer"))
	}
	obs := newCommits(t, map[int32]int64{0: 1})
	c, err := idemkafka.NewConsumer(k.groupClient(t, k.group("mkdlq"), []string{topic}), d.processor(t, nil, handler),
		&idemkafka.Config{CreateDeadLetterTopics: true, Hooks: []idem.Hook{obs}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, obs.done, 30*time.Second, "the partition committed past the dead letter")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	details, err := kadm.NewClient(k.client(t)).ListTopics(context.Background(), topic+".dlq")
	if err != nil {
		t.Fatal(err)
	}
	if dl := details[topic+".dlq"]; dl.Err != nil || len(dl.Partitions) != 3 {
		t.Errorf("dead-letter topic %s: %v, %d partitions; want it created with 3", topic+".dlq", dl.Err, len(dl.Partitions))
	}
	if got := readDLQ(t, k, topic+".dlq", 1)[0]; header(got, idemkafka.DefaultIDHeader) != "bad" {
		t.Errorf("dead letter headers %v; want the record bad", got.Headers)
	}
}

// Run refuses to start when the inbox table is missing (a deploy ahead of
// its migration): before any record is taken, with the fix in the error.
func TestRunRefusesMissingInboxTable(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.topic(t, "noinbox", 1)
	produce(t, k.client(t), topic, 1, 0, 3, msgID)
	d := newDB(t)
	if _, err := d.pool.Exec(context.Background(), `DROP TABLE idem_inbox`); err != nil {
		t.Fatal(err)
	}
	c, err := idemkafka.NewConsumer(k.groupClient(t, k.group("noinbox"), []string{topic}), d.processor(t, nil, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = runOnce(t, c, 30*time.Second)
	if !errors.Is(err, idem.ErrInboxNotReady) {
		t.Fatalf("Run = %v, want idem.ErrInboxNotReady", err)
	}
	if c.Stats().Delivered != 0 {
		t.Errorf("a consumer that refused to start took %d records", c.Stats().Delivered)
	}
	t.Logf("Run refused: %v", err)
}

// An inbox table dropped while the consumer runs (a real DROP TABLE) is a
// configuration outage: the records are held, nothing goes to the
// dead-letter topic, and once the table is migrated again every record is
// applied once.
func TestInboxTableDroppedWhileRunning(t *testing.T) {
	t.Parallel()
	const n, parts = 12, 2
	k := newKafka(t)
	topic := k.topic(t, "dropped", parts)
	prod := k.client(t)
	d := newDB(t)
	out := newOutcomes()
	hooks := newHolds(newCommits(t, ends(n, parts)))
	proc := d.processor(t, out, nil, func(c *idem.Config[pgx.Tx]) { c.Retry.WaitUnavailable = 100 * time.Millisecond })
	c, err := idemkafka.NewConsumer(k.groupClient(t, k.group("dropped"), []string{topic}), proc, &idemkafka.Config{Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	produce(t, prod, topic, parts, 0, parts, msgID)
	wait(t, hooks.reached(ends(parts, parts)), 30*time.Second, "the first records committed")
	ctx := context.Background()
	// Its settings and migration records go too, so that Migrate builds
	// everything again.
	if _, err := d.pool.Exec(ctx, `DROP TABLE idem_inbox, idem_inbox_settings, idem_migrations`); err != nil {
		t.Fatal(err)
	}
	held := hooks.holds.reached(4)
	produce(t, prod, topic, parts, parts, n-parts, msgID)
	wait(t, held, 30*time.Second, "records held while the inbox table is missing")
	if err := d.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wait(t, hooks.done, 30*time.Second, "every partition committed once the table is back")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct; want %d of each", rows, distinct, n)
	}
	s := c.Stats()
	if dl := out.get(idem.DeadLettered); dl != 0 || s.DeadLettered != 0 || len(hooks.dl) != 0 {
		t.Errorf("%d dead-lettered, %d dead letters produced; want none", dl, s.DeadLettered)
	}
	t.Logf("dropped inbox: stats %+v", s)
}

// A dead-letter topic deleted while the consumer runs is checked again
// before the next dead letter, and created again when allowed: the
// partition waits for it, then moves on.
func TestDeadLetterTopicDeletedWhileRunning(t *testing.T) {
	t.Parallel()
	if os.Getenv("IDEM_KAFKA_BROKERS") != "" {
		t.Skip("needs a cluster that does not create topics on first use: kfake only")
	}
	// No topic is created on first use here, so a missing dead-letter
	// topic stays missing until the consumer creates it.
	c := kafkatest.NewCluster(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	k := &kafkaEnv{brokers: c.ListenAddrs(), suffix: hex.EncodeToString(b[:])}
	topic := k.topic(t, "dlqgone", 1)
	d := newDB(t)
	handler := func(_ context.Context, _ pgx.Tx, m idem.Message) error {
		return idem.Permanent(errors.New("no such customer " + m.ID))
	}
	obs := newCommits(t, map[int32]int64{0: 2})
	// The producer gives up on an unknown topic after one retry (not the
	// default four), so that the test need not wait for them.
	cons, err := idemkafka.NewConsumer(k.groupClient(t, k.group("dlqgone"), []string{topic}, kgo.UnknownTopicRetries(1)), d.processor(t, nil, handler),
		&idemkafka.Config{CreateDeadLetterTopics: true, Hooks: []idem.Hook{obs}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, cons)
	prod := k.client(t)
	produce(t, prod, topic, 1, 0, 1, msgID)
	wait(t, obs.reached(map[int32]int64{0: 1}), 30*time.Second, "the first dead letter committed past")
	adm := kadm.NewClient(k.client(t))
	if resp, err := adm.DeleteTopics(context.Background(), topic+".dlq"); err != nil || resp.Error() != nil {
		t.Fatalf("deleting the dead-letter topic: %v %v", err, resp.Error())
	}
	produce(t, prod, topic, 1, 1, 1, msgID)
	wait(t, obs.done, 60*time.Second, "the second dead letter committed past, its topic created again")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := readDLQ(t, k, topic+".dlq", 1)[0]; header(got, idemkafka.DefaultIDHeader) != msgID(1) {
		t.Errorf("the recreated dead-letter topic holds %v; want %s", got.Headers, msgID(1))
	}
}
