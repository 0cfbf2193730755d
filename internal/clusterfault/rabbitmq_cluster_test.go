package clusterfault

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"

	"github.com/idemkit/idem/internal/amqptest"
)

// rabbitScript is the script that runs the 3-node cluster.
var rabbitScript = filepath.Join("..", "..", "scripts", "cluster", "rabbitmq.sh")

// rabbitCluster drives scripts/cluster/rabbitmq.sh.
type rabbitCluster struct{ t testing.TB }

// run runs the script with args and returns its standard output.
func (c rabbitCluster) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{rabbitScript}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmq.sh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func (c rabbitCluster) must(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := c.run(ctx, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// urls are the nodes' AMQP URLs, node 1 first.
func (c rabbitCluster) urls() []string {
	c.t.Helper()
	urls := strings.Fields(c.must("urls"))
	if len(urls) != 3 {
		c.t.Fatalf("rabbitmq.sh urls: %v, want 3", urls)
	}
	return urls
}

// rabbitNodeName is node i's Erlang node name.
func rabbitNodeName(i int) string { return fmt.Sprintf("idem%d@localhost", i) }

// rabbitNodeIndex is the number of a node name, 0 when it is none of ours.
func rabbitNodeIndex(name string) int {
	for i := 1; i <= 3; i++ {
		if name == rabbitNodeName(i) {
			return i
		}
	}
	return 0
}

// leader is the node leading queue.
func (c rabbitCluster) leader(queue string) int {
	c.t.Helper()
	name := c.must("leader", queue)
	i := rabbitNodeIndex(name)
	if i == 0 {
		c.t.Fatalf("leader of %s is %q, not a node of the cluster", queue, name)
	}
	return i
}

// pid is node i's beam process.
func (c rabbitCluster) pid(i int) int {
	c.t.Helper()
	out := c.must("pid", strconv.Itoa(i))
	pid, err := strconv.Atoi(out)
	if err != nil || pid <= 1 {
		c.t.Fatalf("rabbitmq.sh pid %d: %q", i, out)
	}
	return pid
}

// rabbitNodeAt is the node (from 1) listening on addr (127.0.0.1:5702)
// among addrs, node 1's first; 0 when none.
func rabbitNodeAt(addrs []string, addr string) int {
	for i, a := range addrs {
		if a == addr {
			return i + 1
		}
	}
	return 0
}

// rabbitLedger is a PostgreSQL schema with an inbox and a ledger that has NO
// unique constraint: a message applied twice shows as two rows.
type rabbitLedger struct {
	pool *pgxpool.Pool
}

func newRabbitLedger(t testing.TB) *rabbitLedger {
	t.Helper()
	u := pgtest.Schema(t)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE ledger (message_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		t.Fatalf("creating the ledger: %v (%s)", err, pgtest.FixHint)
	}
	return &rabbitLedger{pool: pool}
}

// processor writes one ledger row per message in the claim's transaction.
func (l *rabbitLedger) processor(t testing.TB, obs *rabbitResults) *idem.Processor[pgx.Tx] {
	t.Helper()
	store, err := pgxinbox.New(l.pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger-post",
		Key: func(m idem.Message) (string, error) {
			if obs != nil {
				obs.delivered(m)
			}
			return idem.ByMessageID(m)
		},
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (message_id, amount) VALUES ($1, 100)`, m.ID)
			return err
		},
		Hooks:  []idem.Hook{obs},
		Logger: rabbitQuiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// counts are the ledger's figures over the published IDs.
func (l *rabbitLedger) counts(t testing.TB, ids []string) (applied, lost, doubled int) {
	t.Helper()
	rows, err := l.pool.Query(context.Background(), `SELECT message_id, count(*) FROM ledger GROUP BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		per[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		switch n := per[id]; {
		case n == 0:
			lost++
		case n > 1:
			doubled++
		}
		if per[id] > 0 {
			applied++
		}
	}
	return applied, lost, doubled
}

// rabbitAcks records what the consumer acked, by message, and signals each ack.
type rabbitAcks struct {
	mu      sync.Mutex
	acked   map[string]bool
	onAck   func(n int) // called with the distinct acked count, on the consumer's loop
	changed chan struct{}
}

func newRabbitAcks() *rabbitAcks {
	return &rabbitAcks{acked: map[string]bool{}, changed: make(chan struct{}, 1)}
}

func (a *rabbitAcks) OnSettle(_, _ string, d idem.Disposition, r idem.Result) {
	v := idemrabbitmq.VerbFor(d.Action)
	if v != idemrabbitmq.Ack {
		return
	}
	a.mu.Lock()
	a.acked[r.MessageID] = true
	n := len(a.acked)
	f := a.onAck
	a.mu.Unlock()
	if f != nil {
		f(n)
	}
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

func (a *rabbitAcks) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acked)
}

// waitFor waits until n distinct messages were acked, or d passed; it
// reports whether they were.
func (a *rabbitAcks) waitFor(n int, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for a.count() < n {
		select {
		case <-a.changed:
		case <-deadline.C:
			return false
		}
	}
	return true
}

// rabbitResults counts the processor's outcomes and the highest delivery count
// (x-delivery-count + 1, idem.Message.Attempt) a delivery carried.
type rabbitResults struct {
	mu                  sync.Mutex
	applied, duplicates int
	other               int
	maxAttempt          int
}

// delivered sees every delivery, through the processor's key function.
func (r *rabbitResults) delivered(m idem.Message) {
	r.mu.Lock()
	r.maxAttempt = max(r.maxAttempt, m.Attempt)
	r.mu.Unlock()
}

func (r *rabbitResults) OnOutcome(_ string, res idem.Result, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch res.Outcome {
	case idem.Applied:
		r.applied++
	case idem.Duplicate:
		r.duplicates++
	default:
		r.other++
	}
}

func (r *rabbitResults) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("applied %d, duplicates %d, other outcomes %d, highest delivery count %d",
		r.applied, r.duplicates, r.other, r.maxAttempt)
}

// rabbitPublish publishes n persistent messages with IDs prefix-000000.. to
// queue through conn, with publisher confirms, and returns the IDs.
func rabbitPublish(t testing.TB, conn *amqp.Connection, queue, prefix string, n int) []string {
	t.Helper()
	pub, err := idemrabbitmq.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ids := make([]string, n)
	const chunk = 500
	for from := 0; from < n; from += chunk {
		msgs := make([]amqp.Publishing, 0, chunk)
		for i := from; i < min(from+chunk, n); i++ {
			ids[i] = fmt.Sprintf("%s-%06d", prefix, i)
			msgs = append(msgs, amqp.Publishing{MessageId: ids[i], ContentType: "application/json", Timestamp: time.Now(),
				Body: fmt.Appendf(nil, `{"entry":%d,"amount":100}`, i)})
		}
		if err := pub.Publish(context.Background(), "", queue, msgs...); err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	return ids
}

// rabbitDepths are the ready messages of the queue and of its dead-letter queue.
func rabbitDepths(t testing.TB, conn *amqp.Connection, topo idemrabbitmq.Topology) (ready, dead int) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(topo.Queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting %s: %v", topo.Queue, err)
	}
	d, err := ch.QueueDeclarePassive(topo.DeadLetterQueue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting %s: %v", topo.DeadLetterQueue, err)
	}
	return q.Messages, d.Messages
}

// rabbitDial connects to the first of urls that answers.
func rabbitDial(t testing.TB, urls ...string) *amqp.Connection {
	t.Helper()
	var last error
	for _, u := range urls {
		conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err == nil {
			return conn
		}
		last = err
	}
	t.Fatalf("no broker of %d answered: %v", len(urls), last)
	return nil
}

// rabbitSingleURL is the machine's single broker, for the smoke case.
func rabbitSingleURL() string { return amqptest.URL() }

func rabbitHost(t testing.TB, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
