package clusterfault

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/testrun"
)

var rabbitQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// rabbitScenario is one fault on a consumer draining a quorum queue.
type rabbitScenario struct {
	name     string
	messages int
	// declareOn is the URL the queue is declared and published through (a
	// quorum queue's first leader is the node it was declared on); urls
	// are the consumer's list; inspect is where the queue is inspected at
	// the end (any node that lives).
	declareOn string
	urls      []string
	inspect   []string
	// prepare, when set, runs once the queue exists and before the
	// consumer starts (to find the queue's leader). kill makes the fault as
	// soon as killAt messages were acked, off the test's goroutine while
	// the consumer goes on, and says what it did; node is the address the
	// consumer last connected to. restart, when set, then brings the node
	// back while the consumer goes on.
	killAt  int
	prepare func(t *testing.T, queue string)
	kill    func(node string) (string, error)
	restart func(t *testing.T) string
	timeout time.Duration
}

// runRabbitScenario publishes sc.messages persistent, confirmed messages
// to a fresh quorum queue, drains it with an idem consumer whose effect is
// a ledger row per message in the claim's transaction, makes the fault
// mid-stream, and records what the ledger and the queue say at the end:
// every message applied exactly once and nothing left in the queue.
func runRabbitScenario(t *testing.T, sc rabbitScenario) {
	admin := rabbitDial(t, sc.declareOn)
	defer admin.Close()
	ch, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := "idem-clusterfault-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	topo, err := idemrabbitmq.DeclareQuorumWithDLQ(ch, queue, nil)
	if err != nil {
		t.Fatalf("declaring the quorum queue: %v", err)
	}
	_ = ch.Close()
	t.Cleanup(func() {
		for _, u := range sc.inspect {
			conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
			if err != nil {
				continue
			}
			defer conn.Close()
			if ch, err := conn.Channel(); err == nil {
				_ = idemrabbitmq.DeleteTopology(ch, topo)
			}
			return
		}
	})
	ids := rabbitPublish(t, admin, queue, "entry", sc.messages)
	if sc.prepare != nil {
		sc.prepare(t, queue)
	}

	led := newRabbitLedger(t)
	res := &rabbitResults{}
	rec := newRabbitAcks()
	logs := &rabbitLog{t: t}
	t.Cleanup(logs.close)
	type killed struct {
		note string
		err  error
	}
	kills := make(chan killed, 1)
	var once sync.Once
	rec.onAck = func(n int) {
		if n >= sc.killAt {
			once.Do(func() {
				go func() {
					note, err := sc.kill(logs.consumerNode())
					kills <- killed{fmt.Sprintf("%s at %d acked", note, n), err}
				}()
			})
		}
	}
	c, err := idemrabbitmq.NewConsumer(led.processor(t, res), &idemrabbitmq.Config{
		URLs:             sc.urls,
		Queue:            queue,
		BatchSize:        50,
		Prefetch:         250,
		ReconnectBackoff: idem.Backoff{Initial: 50 * time.Millisecond, Max: time.Second},
		ConnectionName:   "idem-clusterfault-" + queue,
		AMQP:             &amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)},
		Logger:           slog.New(slog.NewTextHandler(logs, nil)),
		Hooks:            []idem.Hook{rec},
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := testrun.Start(t, c, 30*time.Second)

	var notes []string
	select {
	case k := <-kills:
		if k.err != nil {
			t.Fatalf("making the fault: %v", k.err)
		}
		after := rec.count()
		notes = append(notes, k.note+fmt.Sprintf(" (%d when it was done)", after))
		if after >= sc.messages {
			t.Errorf("the fault came after the drain (%d of %d acked): nothing was tested", after, sc.messages)
		}
	case <-time.After(sc.timeout):
		t.Fatalf("only %d of %d messages acked before the fault, after %v", rec.count(), sc.messages, sc.timeout)
	}
	if sc.restart != nil {
		notes = append(notes, sc.restart(t))
	}
	drained := rec.waitFor(sc.messages, sc.timeout)
	elapsed := time.Since(start)
	if err := stop(); err != nil {
		t.Errorf("stopping the consumer: %v", err)
	}

	inspect := rabbitDial(t, sc.inspect...)
	defer inspect.Close()
	ready, dead := rabbitDepths(t, inspect, topo)
	applied, lost, doubled := led.counts(t, ids)
	st := c.Stats()
	notes = append(notes, fmt.Sprintf("%s; consumer reconnects %d, broker-flagged redeliveries %d; drained in %v",
		res, st.Reconnects, st.Redelivered, elapsed.Round(100*time.Millisecond)))
	Record(t, Figure{
		Scenario: sc.name,
		Messages: sc.messages,
		Kills:    1,
		Acked:    sc.messages - ready - dead,
		Lost:     lost,
		Doubled:  doubled,
		Note:     strings.Join(notes, "; "),
	})
	if !drained {
		t.Errorf("%d of %d messages acked within %v", rec.count(), sc.messages, sc.timeout)
	}
	if lost > 0 || doubled > 0 || applied != sc.messages {
		t.Errorf("ledger: %d of %d messages applied, %d lost, %d doubled; want each exactly once", applied, sc.messages, lost, doubled)
	}
	if ready != 0 || dead != 0 {
		t.Errorf("queue: %d ready, %d dead-lettered after the drain; want 0 and 0", ready, dead)
	}
}

// The smoke case, in make test: the machine's single broker behind a list
// of three addresses, the first of which refuses (a node that is down),
// and the node the consumer is on dies mid-stream (its proxy cuts every
// connection and refuses new ones). The consumer skips the dead address at
// start, moves to the next address when its node dies, and the ledger
// shows every message once. A 3-node cluster boots in 15 to 20 s on two
// busy cores, too slow and too load-dependent for make test: the cluster
// runs with IDEM_CLUSTER=1.
func TestRabbitMQSmokeURLFailover(t *testing.T) {
	base := rabbitSingleURL()
	probe, err := amqp.DialConfig(base, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable (%v); start it with: rabbitmq-server -detached && rabbitmqctl await_startup (or run make test), or set IDEM_AMQP_URL", rabbitHost(t, base), err)
	}
	_ = probe.Close()
	dead := netfault.New(t, rabbitHost(t, base))
	dead.Refuse()
	first := netfault.New(t, rabbitHost(t, base))
	second := netfault.New(t, rabbitHost(t, base))
	urls := []string{dead.URL(t, base), first.URL(t, base), second.URL(t, base)}
	runRabbitScenario(t, rabbitScenario{
		name:      "rabbitmq/smoke: one broker behind three addresses, the first down, the one in use cut",
		messages:  500,
		killAt:    150,
		declareOn: base,
		urls:      urls,
		inspect:   []string{base},
		timeout:   45 * time.Second,
		kill: func(node string) (string, error) {
			if node != first.Addr() {
				return "", fmt.Errorf("the consumer is on %s, not on the second address %s", node, first.Addr())
			}
			first.Refuse()
			return "address in use cut and refusing", nil
		},
	})
	if second.Accepted() == 0 {
		t.Error("the consumer never reached the third address")
	}
}

// The full case (IDEM_CLUSTER=1): a 3-node cluster (scripts/cluster/rabbitmq.sh),
// a quorum queue replicated on the three nodes, a consumer given every
// node's URL, and kill -9 of a node mid-stream: the queue's leader, the
// node the consumer is on, and one that is both.
func TestRabbitMQClusterKills(t *testing.T) {
	if !Full() {
		t.Skip("the 3-node RabbitMQ cluster runs with IDEM_CLUSTER=1 (make cluster-faults)")
	}
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		t.Skip("rabbitmq-server is not installed (apt-get install rabbitmq-server): no RabbitMQ cluster to run")
	}
	cl := rabbitCluster{t: t}
	t.Cleanup(func() { cl.must("down") })
	start := time.Now()
	t.Log(cl.must("up"))
	t.Logf("cluster up in %v", time.Since(start).Round(100*time.Millisecond))

	n := 5000
	if v, err := strconv.Atoi(os.Getenv("IDEM_CLUSTER_MESSAGES")); err == nil && v > 0 {
		n = v
	}
	all := cl.urls()
	addrs := make([]string, len(all))
	for i, u := range all {
		addrs[i] = rabbitHost(t, u)
	}
	restart := func(i *int, pids *[4]int) func(t *testing.T) string {
		return func(t *testing.T) string {
			s := time.Now()
			cl := rabbitCluster{t: t}
			cl.must("start", strconv.Itoa(*i))
			if pid := cl.pid(*i); pid == pids[*i] {
				t.Fatalf("%s still has the killed pid %d after start", rabbitNodeName(*i), pid)
			}
			return fmt.Sprintf("%s restarted in %v", rabbitNodeName(*i), time.Since(s).Round(100*time.Millisecond))
		}
	}
	for _, sc := range []struct {
		test, name string
		declareOn  int    // the queue's first leader (the consumer starts on node 1)
		target     string // "leader" or "consumer"
		sameNode   bool   // whether the leader is the consumer's node
		restart    bool
	}{
		{"leader", "rabbitmq/quorum: leader killed -9 (not the consumer's node), restarted", 3, "leader", false, true},
		{"consumer-node", "rabbitmq/quorum: consumer's node killed -9 (a follower), not restarted", 2, "consumer", false, false},
		{"leader-and-consumer-node", "rabbitmq/quorum: leader and consumer's node (one node) killed -9, restarted", 1, "consumer", true, true},
	} {
		t.Run(sc.test, func(t *testing.T) {
			cl := rabbitCluster{t: t}
			cl.must("up") // a node the last scenario left down comes back
			var leader, killed int
			var pids [4]int
			s := rabbitScenario{
				name: sc.name, messages: n, killAt: n / 4,
				declareOn: all[sc.declareOn-1], urls: all, inspect: all,
				timeout: 3 * time.Minute,
				prepare: func(t *testing.T, queue string) {
					leader = cl.leader(queue)
					for i := 1; i <= 3; i++ {
						pids[i] = cl.pid(i)
					}
				},
				kill: func(node string) (string, error) {
					on := rabbitNodeAt(addrs, node)
					if on == 0 {
						return "", fmt.Errorf("the consumer is on %q, no node of the cluster", node)
					}
					if (on == leader) != sc.sameNode {
						return "", fmt.Errorf("leader %s, consumer on %s: not the scenario's layout", rabbitNodeName(leader), rabbitNodeName(on))
					}
					killed = leader
					if sc.target == "consumer" {
						killed = on
					}
					// kill -9 of the node's beam process, what
					// rabbitmq.sh kill does, without a shell's start-up
					// in between: the fault lands mid-stream.
					err := syscall.Kill(pids[killed], syscall.SIGKILL)
					if err == nil {
						err = rabbitAwaitDeath(pids[killed])
					}
					return fmt.Sprintf("leader %s, consumer on %s: killed %s", rabbitNodeName(leader), rabbitNodeName(on), rabbitNodeName(killed)), err
				},
			}
			if sc.restart {
				s.restart = restart(&killed, &pids)
			}
			runRabbitScenario(t, s)
			if !sc.restart {
				// Say what the cluster ran on: two nodes of three.
				t.Logf("%s stays down until the next scenario", rabbitNodeName(killed))
			}
		})
	}
}

// rabbitLog writes a consumer's log lines to the test log until the test
// ends, and keeps the node the consumer last connected to.
type rabbitLog struct {
	mu     sync.Mutex
	t      *testing.T
	closed bool
	node   string
}

var rabbitConsumingOn = regexp.MustCompile(`msg=consuming .*\bnode=(\S+)`)

func (l *rabbitLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := rabbitConsumingOn.FindSubmatch(p); m != nil {
		l.node = string(m[1])
	}
	if !l.closed {
		l.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// consumerNode is the address the consumer last connected to.
func (l *rabbitLog) consumerNode() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.node
}

func (l *rabbitLog) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

// rabbitAwaitDeath waits until process pid is gone or a zombie: a killed
// node still exiting holds its ports for a moment, and a start then would
// take it for running.
func rabbitAwaitDeath(pid int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil // gone
		}
		// The state follows the command, which is in parentheses.
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d still alive 30s after kill -9", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
