package clusterfault

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/testrun"
)

// natsScenario is a 3-node JetStream cluster whose R3 stream loses its
// leader kills times while an idemnats consumer drains it.
type natsScenario struct {
	name     string
	messages int
	kills    int
	timeout  time.Duration
}

// The environment of a JetStream node: this test binary, run again as a
// nats-server process (the nats-server module, as the suite's other
// JetStream tests embed it), so that a node can be killed with SIGKILL.
const (
	natsNodeName   = "IDEM_CLUSTERFAULT_NATS_NAME"
	natsNodePorts  = "IDEM_CLUSTERFAULT_NATS_PORTS" // client port, route port
	natsNodeRoutes = "IDEM_CLUSTERFAULT_NATS_ROUTES"
	natsNodeStore  = "IDEM_CLUSTERFAULT_NATS_STORE"
	// natsNodeLog, set in the test's environment, makes the nodes log to
	// the test's standard error.
	natsNodeLog = "IDEM_CLUSTERFAULT_NATS_LOG"
)

// runNATSNode runs a JetStream cluster node described by the environment
// until the process is killed; it reports false when the process is not
// one.
func runNATSNode() bool {
	name := os.Getenv(natsNodeName)
	if name == "" {
		return false
	}
	ports := strings.Split(os.Getenv(natsNodePorts), ",")
	port, _ := strconv.Atoi(ports[0])
	routePort, _ := strconv.Atoi(ports[1])
	opts := &server.Options{
		ServerName: name,
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   os.Getenv(natsNodeStore),
		NoLog:      os.Getenv(natsNodeLog) == "",
		NoSigs:     true,
		SyncAlways: true, // a PubAck means on disk, on a majority
		Cluster:    server.ClusterOpts{Name: "idem", Host: "127.0.0.1", Port: routePort},
		Routes:     server.RoutesFromStr(os.Getenv(natsNodeRoutes)),
	}
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if !opts.NoLog {
		s.ConfigureLogger()
	}
	s.Start()
	s.WaitForShutdown()
	os.Exit(0)
	return true
}

// natsNode is one node process of a natsProcCluster.
type natsNode struct {
	t    testing.TB
	name string
	port int
	env  []string
	cmd  *exec.Cmd
	exit chan error
}

// natsProcCluster is three JetStream nodes, each a process of its own with
// a store directory of its own, routed to each other.
type natsProcCluster struct {
	nodes []*natsNode
}

func startNATSProcCluster(t testing.TB) *natsProcCluster {
	t.Helper()
	cl := &natsProcCluster{}
	var routes []string
	routePorts := make([]int, 3)
	for i := range routePorts {
		routePorts[i] = natsFreePort(t)
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(routePorts[i]))
	}
	for i := range 3 {
		n := &natsNode{t: t, name: fmt.Sprintf("n%d", i+1), port: natsFreePort(t)}
		n.env = append(os.Environ(),
			natsNodeName+"="+n.name,
			natsNodePorts+"="+strconv.Itoa(n.port)+","+strconv.Itoa(routePorts[i]),
			natsNodeRoutes+"="+strings.Join(routes, ","),
			natsNodeStore+"="+t.TempDir(),
		)
		cl.nodes = append(cl.nodes, n)
		t.Cleanup(n.kill)
	}
	// The nodes start together, as natstest's do: JetStream elects its
	// meta leader once the routes are up.
	for _, n := range cl.nodes {
		n.spawn()
	}
	for _, n := range cl.nodes {
		n.waitListening()
	}
	return cl
}

// URLs are the nodes' client URLs, comma-separated.
func (cl *natsProcCluster) URLs() string {
	var us []string
	for _, n := range cl.nodes {
		us = append(us, "nats://127.0.0.1:"+strconv.Itoa(n.port))
	}
	return strings.Join(us, ",")
}

func (cl *natsProcCluster) node(name string) *natsNode {
	for _, n := range cl.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// start starts the node's process and waits until it accepts connections.
func (n *natsNode) start() {
	n.t.Helper()
	n.spawn()
	n.waitListening()
}

// spawn starts the node's process.
func (n *natsNode) spawn() {
	n.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = n.env
	if os.Getenv(natsNodeLog) != "" {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("starting JetStream node %s: %v", n.name, err)
	}
	n.cmd, n.exit = cmd, make(chan error, 1)
	go func() { n.exit <- cmd.Wait() }()
}

// waitListening waits until the node accepts connections.
func (n *natsNode) waitListening() {
	n.t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(n.port)
	if !waitUntil(60*time.Second, func() bool {
		select {
		case err := <-n.exit:
			n.exit <- err
			return true
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}) {
		n.t.Fatalf("JetStream node %s not listening on %s within 60s", n.name, addr)
	}
	select {
	case err := <-n.exit:
		n.t.Fatalf("JetStream node %s exited at start: %v", n.name, err)
	default:
	}
}

// kill kills the node's process with SIGKILL and waits until it is gone.
func (n *natsNode) kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exit
	n.cmd = nil
}

func natsFreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// natsStreamState is stream's leader (empty when it has none) and whether
// both of its other replicas are online and current.
func natsStreamState(js jetstream.JetStream, stream string) (leader string, current bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil || st.CachedInfo().Cluster == nil {
		return "", false
	}
	c := st.CachedInfo().Cluster
	current = len(c.Replicas) == 2
	for _, r := range c.Replicas {
		current = current && r.Current && !r.Offline
	}
	return c.Leader, current
}

// runNATSScenario publishes sc.messages messages (IDs entry-000000.., in
// Nats-Msg-Id) to a fresh R3 stream, drains it with an idemnats consumer
// whose effect is a ledger row per message in the claim's transaction,
// and stops the stream's leader sc.kills times mid-stream (the messages
// are published in sc.kills+1 parts, the next once the cluster recovered,
// so that each kill finds messages to consume), each time
// between a batch's COMMIT and its acks, starting it again once a new
// leader was elected and waiting until its replica is current before the
// next kill. It records what the ledger, the consumer and the dead-letter
// stream say at the end: every message applied exactly once, nothing
// pending, nothing dead-lettered.
func runNATSScenario(t *testing.T, sc natsScenario) {
	cl := startNATSProcCluster(t)
	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := "IDEM_CF_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx, cancel := context.WithTimeout(context.Background(), sc.timeout)
	defer cancel()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: stream, Subjects: []string{stream + ".msgs"}, Storage: jetstream.FileStorage, Replicas: 3},
		{Name: stream + "_DLQ", Subjects: []string{"idem.dlq." + stream}, Storage: jetstream.FileStorage, Replicas: 3},
	} {
		for {
			// A request sent before the cluster elected its meta leader
			// gets no answer: each try has a deadline of its own.
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := js.CreateStream(cctx, cfg)
			ccancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("creating stream %s: %v", cfg.Name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	phase := sc.messages / (sc.kills + 1)
	ids := natsPublish(t, ctx, js, stream+".msgs", 0, phase)

	led := newRabbitLedger(t)
	res := &rabbitResults{}
	var armed atomic.Pointer[natsNode]
	killed := make(chan string, 1)
	c, err := idemnats.NewConsumer(led.processor(t, res), &idemnats.Config{
		URL: cl.URLs(), Stream: stream, Durable: "ledger", BatchSize: 50,
		AckWait: 6 * time.Second, FetchWait: time.Second,
		Backoff: idem.Backoff{Initial: 50 * time.Millisecond, Max: time.Second},
		Logger:  rabbitQuiet,
		// The kill, once armed, lands between a batch's COMMIT and its
		// acks, on the consumer's goroutine.
		Faults: func(context.Context, idem.FaultPoint, []idem.Message) error {
			if n := armed.Swap(nil); n != nil {
				n.kill()
				killed <- n.name
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := testrun.Start(t, c, 30*time.Second)

	var notes []string
	for k := 1; k <= sc.kills; k++ {
		at := (k-1)*phase + phase/2
		if !waitUntil(sc.timeout, func() bool { return res.appliedCount() >= at }) {
			t.Fatalf("only %d of %d messages settled before kill %d, after %v", res.settled(), sc.messages, k, sc.timeout)
		}
		var leader string
		if !waitUntil(sc.timeout, func() bool {
			var current bool
			leader, current = natsStreamState(js, stream)
			return leader != "" && current
		}) {
			t.Fatalf("stream %s has no leader with two current replicas within %v", stream, sc.timeout)
		}
		armed.Store(cl.node(leader))
		var name string
		select {
		case name = <-killed:
		case <-time.After(sc.timeout):
			t.Fatalf("no batch committed within %v of arming kill %d", sc.timeout, k)
		}
		settledAt, stopped := res.settled(), time.Now()
		var next string
		if !waitUntil(sc.timeout, func() bool { next, _ = natsStreamState(js, stream); return next != "" && next != name }) {
			t.Fatalf("no new stream leader within %v after %s was killed", sc.timeout, name)
		}
		elected := time.Since(stopped)
		cl.node(name).start()
		if !waitUntil(sc.timeout, func() bool { _, current := natsStreamState(js, stream); return current }) {
			t.Fatalf("%s's replica of %s not current within %v of its restart", name, stream, sc.timeout)
		}
		notes = append(notes, fmt.Sprintf("leader %s killed at %d settled, %s seen leading after %v", name, settledAt, next, elected.Round(100*time.Millisecond)))
		to := (k + 1) * phase
		if k == sc.kills {
			to = sc.messages
		}
		ids = append(ids, natsPublish(t, ctx, js, stream+".msgs", k*phase, to)...)
	}

	var info *jetstream.ConsumerInfo
	drained := waitUntil(sc.timeout, func() bool {
		ictx, icancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer icancel()
		cons, err := js.Consumer(ictx, stream, "ledger")
		if err != nil {
			return false
		}
		info, err = cons.Info(ictx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	elapsed := time.Since(start)
	if err := stop(); err != nil {
		t.Errorf("stopping the consumer: %v", err)
	}
	if !drained {
		t.Fatalf("the consumer was not drained within %v (last info %+v)", sc.timeout, info)
	}
	dlq, err := js.Stream(ctx, stream+"_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	dead := dlq.CachedInfo().State.Msgs
	applied, lost, doubled := led.counts(t, ids)
	st := c.Stats()
	notes = append(notes, fmt.Sprintf("%d dead-lettered; %s; consumer: %d reconnects, %d redelivered by JetStream; drained in %v",
		dead, res, st.Reconnects, st.Redelivered, elapsed.Round(100*time.Millisecond)))
	Record(t, Figure{
		Scenario: sc.name,
		Messages: sc.messages,
		Kills:    sc.kills,
		Acked:    sc.messages - int(info.NumPending) - info.NumAckPending,
		Lost:     lost,
		Doubled:  doubled,
		Note:     "stream leader's process killed -9 between a COMMIT and its acks, restarted once a new leader was elected: " + strings.Join(notes, "; "),
	})
	if lost > 0 || doubled > 0 || applied != sc.messages {
		t.Errorf("ledger: %d of %d messages applied, %d lost, %d doubled; want each exactly once", applied, sc.messages, lost, doubled)
	}
	if dead != 0 || st.DeadLettered != 0 {
		t.Errorf("%d dead letters (stats %d); want none", dead, st.DeadLettered)
	}
}

// natsPublish publishes the messages first to end-1, with IDs
// entry-<number> in Nats-Msg-Id, to subject, each acknowledged by the
// stream (on a majority of its replicas), and returns their IDs.
func natsPublish(t testing.TB, ctx context.Context, js jetstream.JetStream, subject string, first, end int) []string {
	t.Helper()
	var ids []string
	const chunk = 250
	for from := first; from < end; from += chunk {
		var acks []jetstream.PubAckFuture
		for i := from; i < min(from+chunk, end); i++ {
			id := fmt.Sprintf("entry-%06d", i)
			ids = append(ids, id)
			f, err := js.PublishAsync(subject, fmt.Appendf(nil, `{"entry":%d,"amount":100}`, i), jetstream.WithMsgID(id))
			if err != nil {
				t.Fatalf("publishing %s: %v", id, err)
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publishing %s: %v", f.Msg().Header.Get(jetstream.MsgIDHeader), err)
			case <-ctx.Done():
				t.Fatalf("publishing: no ack within the deadline: %v", ctx.Err())
			}
		}
	}
	return ids
}

// The full case (IDEM_CLUSTER=1): a 3-node JetStream cluster (embedded
// nats-server), an R3 stream, and its leader stopped three times
// mid-stream, each time between a batch's COMMIT and its acks. The
// survivors elect a new leader, the consumer reconnects, and what was
// not acked comes back as Duplicates: nothing lost, nothing doubled,
// nothing dead-lettered.
func TestJetStreamLeaderLoss(t *testing.T) {
	if !Full() {
		t.Skip("the 3-node JetStream cluster runs with IDEM_CLUSTER=1 (make cluster-faults)")
	}
	runNATSScenario(t, natsScenario{name: "jetstream/R3: stream leader killed -9, restarted (3 times)", messages: 3000, kills: 3, timeout: 3 * time.Minute})
}
