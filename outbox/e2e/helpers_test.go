package e2e_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/pgxinbox"
)

const fixHint = "start it with: rabbitmq-server -detached && rabbitmqctl await_startup (or run make test), or set IDEM_AMQP_URL"

// pipeline is one test's database schema (inbox, outbox, the two
// consumers' effect tables without unique constraints, so that an effect
// applied twice shows) and its two queues.
type pipeline struct {
	url            string
	pool           *pgxpool.Pool
	ob             *outbox.Outbox[pgx.Tx]
	conn           *amqp.Connection
	queueA, queueB string
}

func newPipeline(t testing.TB) *pipeline {
	t.Helper()
	ctx := context.Background()
	p := &pipeline{url: pgtest.Schema(t)}
	pool, err := pgxpool.New(ctx, p.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p.pool = pool
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if p.ob, err = outbox.NewPgx(pool, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE a_effects (message_id text NOT NULL, n int NOT NULL);
CREATE TABLE b_effects (message_id text NOT NULL, n int NOT NULL, cause text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p.conn, err = amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable (%v); %s", err, fixHint)
	}
	t.Cleanup(func() { _ = p.conn.Close() })
	suffix := make([]byte, 4)
	_, _ = crand.Read(suffix)
	base := "outbox-e2e-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "-" + hex.EncodeToString(suffix)
	p.queueA, p.queueB = p.declare(t, base+"-a"), p.declare(t, base+"-b")
	return p
}

// declare makes a quorum queue with its dead-letter queue; kills redeliver
// often, so the delivery limit is high.
func (p *pipeline) declare(t testing.TB, q string) string {
	t.Helper()
	ch, err := p.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	top, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, q, &idemrabbitmq.TopologyOptions{DeliveryLimit: 1000})
	if err != nil {
		t.Fatalf("declaring %s: %v", q, err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(amqpURL())
		if err != nil {
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(top.Queue, false, false, false)
		_, _ = ch.QueueDelete(top.DeadLetterQueue, false, false, false)
		_ = ch.ExchangeDelete(top.DeadLetterExchange, false, false)
	})
	return top.Queue
}

// env is what a role process needs to find its parts.
func (p *pipeline) env(extra ...string) []string {
	return append([]string{dbEnv + "=" + p.url, queueAEnv + "=" + p.queueA, queueBEnv + "=" + p.queueB, amqpURLEnv + "=" + amqpURL()}, extra...)
}

// publishInput publishes input messages from..to-1 to queue A, each with
// its own message ID.
func (p *pipeline) publishInput(t testing.TB, from, to int) {
	t.Helper()
	pub, err := idemrabbitmq.NewPublisher(p.conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := make([]amqp.Publishing, 0, to-from)
	for n := from; n < to; n++ {
		msgs = append(msgs, amqp.Publishing{MessageId: "in-" + strconv.Itoa(n), Body: []byte(strconv.Itoa(n))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pub.Publish(ctx, "", p.queueA, msgs...); err != nil {
		t.Fatalf("publishing the input: %v", err)
	}
}

// counts is what the effect tables and the outbox hold.
type counts struct {
	aRows, aDistinct, bRows, bDistinct, unsent, parked int64
}

func (p *pipeline) counts(t testing.TB) counts {
	t.Helper()
	var c counts
	err := p.pool.QueryRow(context.Background(), `SELECT
  (SELECT count(*) FROM a_effects), (SELECT count(DISTINCT message_id) FROM a_effects),
  (SELECT count(*) FROM b_effects), (SELECT count(DISTINCT message_id) FROM b_effects),
  (SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL AND parked_at IS NULL),
  (SELECT count(*) FROM idem_outbox WHERE parked_at IS NOT NULL)`).
		Scan(&c.aRows, &c.aDistinct, &c.bRows, &c.bDistinct, &c.unsent, &c.parked)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitFor polls until done reports true, failing the test after limit
// (a guard against a pipeline that stalls, not a measure of its speed).
func waitFor(t testing.TB, limit time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", limit, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// process is a role running as a child process of the test. Like a
// service manager, it starts the role again when it exits on its own (a
// start-up failure on a loaded machine, say), unless it is one-shot.
type process struct {
	t         testing.TB
	role      string
	env       []string
	supervise bool
	out       *lockedBuffer

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	killing bool // the test is killing it: not an exit of its own
	closed  bool // the test ended
	exits   int  // exits of its own, restarted
}

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

// spawn starts role, restarted whenever it exits on its own; it is killed
// when the test ends, and what it wrote is logged if the test failed.
func spawn(t testing.TB, role string, env []string) *process {
	return spawnProcess(t, role, env, true)
}

// spawnOnce starts role once: it is not restarted when it exits.
func spawnOnce(t testing.TB, role string, env []string) *process {
	return spawnProcess(t, role, env, false)
}

func spawnProcess(t testing.TB, role string, env []string, supervise bool) *process {
	t.Helper()
	p := &process{t: t, role: role, env: env, supervise: supervise, out: &lockedBuffer{}}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.kill()
		if t.Failed() {
			if s := p.out.String(); s != "" {
				t.Logf("%s wrote:\n%s", role, s)
			}
		}
	})
	return p
}

func (p *process) start() error {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{roleEnv + "=" + p.role}, p.env...)...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.role, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	if p.closed { // the test ended while this one started
		p.mu.Unlock()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil
	}
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		p.mu.Lock()
		own := !p.killing && !p.closed
		if own {
			p.exits++
		}
		close(done)
		p.mu.Unlock()
		if !own || !p.supervise {
			return
		}
		time.Sleep(200 * time.Millisecond)
		p.mu.Lock()
		again := !p.closed && p.cmd == cmd
		p.mu.Unlock()
		if again {
			if err := p.start(); err != nil {
				p.t.Log(err) // the next kill of the test starts it again
			}
		}
	}()
	return nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *process) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.killing = true
	p.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
	p.mu.Lock()
	p.killing = false
	p.mu.Unlock()
}

// restart kills the process and starts it again.
func (p *process) restart() {
	p.kill()
	if err := p.start(); err != nil {
		p.t.Error(err)
	}
}

// exited is closed when the current process ended.
func (p *process) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// ownExits is how often the process exited without being killed.
func (p *process) ownExits() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exits
}
