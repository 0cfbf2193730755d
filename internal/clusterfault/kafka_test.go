package clusterfault

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/testrun"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The Kafka scenarios run idem consumers in one group against a 3-broker
// kfake cluster while the partition leaders and the group coordinator are
// taken away, and check at the end, from the broker and the database:
//   - every message has exactly one ledger row (its effect, written in the
//     transaction of its inbox claim);
//   - the group's committed offsets are the partitions' end offsets;
//   - no offset was committed past a record whose database transaction had
//     not committed when the commit reached the coordinator;
//   - the offsets the broker accepted never went backwards, but to where a
//     client resumed after it reported the log truncated below what it had
//     consumed (kfake does after a leader change; idemkafka then commits
//     again from there), and no member had an offset accepted for a
//     partition it had given up.
//
// A node is stopped the way a broker process dies: its listener closes
// (kfake.RemoveNode; kfake elects new leaders among the nodes left and
// rehashes the coordinators over them) and every request that still
// arrives on a connection to it closes that connection unanswered. Once
// the group made progress without it, a replacement node with a new ID
// joins (kfake.AddNode), so the cluster has three nodes again. (Bringing
// back the same ID would let a connection that stayed idle while the node
// was down reach the new node under the old one's identity, which no
// restarted broker process allows: kfake then answers NOT_LEADER on it
// forever, and the client, which keeps one connection per broker ID,
// never recovers.)

func TestKafkaSmoke(t *testing.T) {
	runKafka(t, kafkaScenario{
		name:     "kafka (smoke): one leader election, one coordinator move",
		messages: 300,
		faults:   []kafkaFault{shuffleLeaders, rehashCoordinators},
	})
}

func TestKafkaLeaderLoss(t *testing.T) {
	if !Full() {
		t.Skip("IDEM_CLUSTER=1 runs the whole suite")
	}
	runKafka(t, kafkaScenario{
		name:     "kafka: partition leaders lost",
		messages: 3000,
		faults:   []kafkaFault{shuffleLeaders, stopLeader, shuffleLeaders, stopLeader, shuffleLeaders, stopLeader},
	})
}

func TestKafkaCoordinatorLoss(t *testing.T) {
	if !Full() {
		t.Skip("IDEM_CLUSTER=1 runs the whole suite")
	}
	runKafka(t, kafkaScenario{
		name:     "kafka: group coordinator lost",
		messages: 3000,
		faults:   []kafkaFault{rehashCoordinators, stopCoordinator, rehashCoordinators, stopCoordinator, rehashCoordinators, stopCoordinator},
		note:     "a stopped coordinator's node also loses its partition leaders (kfake re-elects all on a node change)",
	})
}

func TestKafkaLeaderAndCoordinatorLoss(t *testing.T) {
	if !Full() {
		t.Skip("IDEM_CLUSTER=1 runs the whole suite")
	}
	runKafka(t, kafkaScenario{
		name:     "kafka: leaders and coordinator lost, members churn",
		messages: 3000,
		faults:   []kafkaFault{stopCoordinator, shuffleAndRehash, stopLeader, shuffleAndRehash, stopCoordinator, shuffleAndRehash},
		churn:    true,
	})
}

const (
	kafkaNodes      = 3
	kafkaPartitions = 6
)

type kafkaScenario struct {
	name     string
	messages int
	// faults are applied one after the other, spread over the
	// consumption; the second member joins as the first fault strikes.
	faults []kafkaFault
	// churn: the second member leaves as the third fault strikes and a
	// third joins as the fourth does.
	churn bool
	note  string
}

// A kafkaFault takes something away and reports how many leaders,
// coordinators or nodes it took.
type kafkaFault func(t *testing.T, r *kafkaRig) int

func shuffleLeaders(_ *testing.T, r *kafkaRig) int {
	r.c.ShufflePartitionLeaders()
	return 1
}

func rehashCoordinators(_ *testing.T, r *kafkaRig) int {
	r.c.RehashCoordinators()
	return 1
}

func shuffleAndRehash(_ *testing.T, r *kafkaRig) int {
	r.c.ShufflePartitionLeaders()
	r.c.RehashCoordinators()
	return 2
}

// stopLeader stops the node leading some partition, preferring one that
// is not the group coordinator, until the group made progress without it.
func stopLeader(t *testing.T, r *kafkaRig) int {
	coord := r.c.CoordinatorFor(r.group)
	node := r.c.LeaderFor(r.topic, 0)
	for p := range int32(kafkaPartitions) {
		if l := r.c.LeaderFor(r.topic, p); l != coord {
			node = l
			break
		}
	}
	r.stopUntilProgress(t, node)
	return 1
}

// stopCoordinator stops the group coordinator's node until the group made
// progress without it.
func stopCoordinator(t *testing.T, r *kafkaRig) int {
	r.stopUntilProgress(t, r.c.CoordinatorFor(r.group))
	return 1
}

// kafkaRig is one scenario's cluster, database and consumers.
type kafkaRig struct {
	t     *testing.T
	c     *kfake.Cluster
	topic string
	group string
	pool  *pgxpool.Pool
	store *pgxinbox.Store
	log   *slog.Logger

	downMu   sync.Mutex
	down     map[int32]bool
	nextNode int32 // the last node ID given out

	applied   atomic.Int64 // Applied outcomes
	fetchErrs atomic.Int64 // fetch errors the consumers logged

	mu sync.Mutex
	// produced maps partition → offset → message ID.
	produced map[int32]map[int64]string
	// accepted is the last offset per partition the broker accepted from
	// any member (as the members' commit hooks see it).
	accepted  map[int32]int64
	acceptedN int
	// floor is, per partition, where a client resumed after it reported
	// the log truncated below what it consumed (kfake does so after a
	// leader change): commits may go back to it, never below.
	floor        map[int32]int64
	dataLosses   int
	commitErrs   map[string]int
	brokerCommit []brokerCommit
	misdirected  int           // commits that reached a stopped node or one not the coordinator
	progress     chan struct{} // closed and replaced on every accepted commit
	members      []*kafkaMember
}

// brokerCommit is one OffsetCommit as the coordinator received it, with
// the ledger's message IDs of its partition at that moment.
type brokerCommit struct {
	member    string
	gen       int32
	partition int32
	offset    int64
	ledger    map[string]bool
}

func newKafkaRig(t *testing.T) *kafkaRig {
	c := kafkatest.NewCluster(t, kfake.NumBrokers(kafkaNodes))
	r := &kafkaRig{
		t: t, c: c, down: map[int32]bool{}, nextNode: kafkaNodes - 1,
		topic: "ledger", group: "ledger-consumers",
		produced: map[int32]map[int64]string{}, accepted: map[int32]int64{}, floor: map[int32]int64{},
		commitErrs: map[string]int{}, progress: make(chan struct{}),
	}
	r.log = slog.New(&fetchErrors{Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), n: &r.fetchErrs})

	// A stopped node answers nothing: a request on a connection opened
	// before it stopped closes the connection.
	c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if r.isDown(c.CurrentNode()) {
			return nil, fmt.Errorf("node %d is stopped", c.CurrentNode()), true
		}
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r.observeCommit(req.(*kmsg.OffsetCommitRequest))
		return nil, nil, false
	})

	url := pgtest.Schema(t)
	var err error
	r.pool, err = pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(r.pool.Close)
	ctx := context.Background()
	if r.store, err = pgxinbox.New(r.pool, &pgxinbox.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := r.store.Migrate(ctx); err != nil {
		t.Fatalf("migrating inbox: %v", err)
	}
	// No unique constraint: an effect applied twice shows as two rows.
	if _, err := r.pool.Exec(ctx, `CREATE TABLE ledger (message_id text NOT NULL, source text NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	adm := kadm.NewClient(r.client(t))
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, name := range []string{r.topic, r.topic + ".dlq"} {
		resp, err := adm.CreateTopic(cctx, kafkaPartitions, kafkaNodes, nil, name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating topic %s: %v", name, err)
		}
	}
	return r
}

func (r *kafkaRig) isDown(node int32) bool {
	r.downMu.Lock()
	defer r.downMu.Unlock()
	return r.down[node]
}

// observeCommit runs on the cluster's loop for every OffsetCommit request,
// before the cluster handles it. Requests that will be refused because
// they reached a stopped node or one that is not the coordinator are left
// out; for the others it takes the ledger of each partition named, which
// must already hold every record below the offset.
func (r *kafkaRig) observeCommit(req *kmsg.OffsetCommitRequest) {
	node := r.c.CurrentNode()
	if r.isDown(node) || r.c.CoordinatorFor(req.Group) != node {
		r.mu.Lock()
		r.misdirected++
		r.mu.Unlock()
		return
	}
	for _, tp := range req.Topics {
		for _, p := range tp.Partitions {
			ids, err := r.ledgerOf(p.Partition)
			if err != nil {
				r.t.Errorf("reading the ledger at an offset commit: %v", err)
				return
			}
			r.mu.Lock()
			r.brokerCommit = append(r.brokerCommit, brokerCommit{member: req.MemberID, gen: req.Generation, partition: p.Partition, offset: p.Offset, ledger: ids})
			r.mu.Unlock()
		}
	}
}

func (r *kafkaRig) ledgerOf(partition int32) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := r.pool.Query(ctx, `SELECT message_id FROM ledger WHERE source = $1`, fmt.Sprintf("%s/%d", r.topic, partition))
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m, nil
}

// stop takes node away for good; replace adds a node in its place.
func (r *kafkaRig) stop(t *testing.T, node int32) {
	r.downMu.Lock()
	r.down[node] = true
	r.downMu.Unlock()
	if err := r.c.RemoveNode(node); err != nil {
		t.Fatalf("stopping node %d: %v", node, err)
	}
}

func (r *kafkaRig) replace(t *testing.T, node int32) {
	// A fresh ID: kfake's next one (one above the highest left) may be
	// the stopped node's.
	r.nextNode++
	if _, _, err := r.c.AddNode(r.nextNode, 0); err != nil {
		t.Fatalf("adding node %d in place of %d: %v", r.nextNode, node, err)
	}
}

// stopUntilProgress stops node and adds a replacement once the group had
// three more commits accepted without it (or everything produced so far
// was applied).
func (r *kafkaRig) stopUntilProgress(t *testing.T, node int32) {
	r.mu.Lock()
	from := r.acceptedN
	r.mu.Unlock()
	r.stop(t, node)
	deadline := time.After(90 * time.Second)
	for {
		r.mu.Lock()
		n, ch := r.acceptedN, r.progress
		r.mu.Unlock()
		if n >= from+3 || r.applied.Load() >= int64(r.producedN()) && r.caughtUp() {
			break
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the group made no progress within 90s with node %d stopped; %s", node, r.state())
		}
	}
	r.replace(t, node)
}

func (r *kafkaRig) producedN() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ps := range r.produced {
		n += len(ps)
	}
	return n
}

// caughtUp reports whether every partition's accepted offset is past all
// that was produced to it so far.
func (r *kafkaRig) caughtUp() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, offs := range r.produced {
		if r.accepted[p] < int64(len(offs)) {
			return false
		}
	}
	return true
}

// client returns a plain client (producer, admin) on every node.
func (r *kafkaRig) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(r.c.ListenAddrs()...), kgo.ProducerLinger(0)}, opts...)...)
	if err != nil {
		t.Fatalf("creating client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produce writes n messages with keys spread over the partitions (acks
// from all in-sync replicas and idempotence, franz-go's defaults), in
// chunks, and notes where each landed.
func (r *kafkaRig) produce(t *testing.T, n int) <-chan struct{} {
	cl := r.client(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		const chunk = 50
		for from := 0; from < n; from += chunk {
			recs := make([]*kgo.Record, 0, chunk)
			for i := from; i < min(from+chunk, n); i++ {
				id := fmt.Sprintf("msg-%06d", i)
				recs = append(recs, idemkafka.NewRecord(r.topic, id, []byte(fmt.Sprintf("account-%d", i%97)), []byte(fmt.Sprintf(`{"id":%q,"amount":%d}`, id, i))))
			}
			res := cl.ProduceSync(ctx, recs...)
			if err := res.FirstErr(); err != nil {
				t.Errorf("producing: %v", err)
				return
			}
			r.mu.Lock()
			for _, pr := range res {
				rec := pr.Record
				if r.produced[rec.Partition] == nil {
					r.produced[rec.Partition] = map[int64]string{}
				}
				r.produced[rec.Partition][rec.Offset] = string(idemHeader(rec))
			}
			r.mu.Unlock()
		}
	}()
	return done
}

func idemHeader(rec *kgo.Record) []byte {
	for _, h := range rec.Headers {
		if h.Key == idemkafka.DefaultIDHeader {
			return h.Value
		}
	}
	return nil
}

// fetchErrors counts the consumers' fetch errors instead of printing
// them: after each leader change kfake answers the client's epoch query
// so that it takes the log for truncated and rewinds, one line per
// partition.
type fetchErrors struct {
	slog.Handler
	n *atomic.Int64
}

func (h *fetchErrors) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Message == "fetch error" {
		h.n.Add(1)
		return nil
	}
	return h.Handler.Handle(ctx, rec)
}

func (h *fetchErrors) WithAttrs(as []slog.Attr) slog.Handler {
	return &fetchErrors{Handler: h.Handler.WithAttrs(as), n: h.n}
}

func (h *fetchErrors) WithGroup(name string) slog.Handler {
	return &fetchErrors{Handler: h.Handler.WithGroup(name), n: h.n}
}

// kafkaMember is one consumer of the group and what it was given.
type kafkaMember struct {
	name string
	rig  *kafkaRig
	cons *idemkafka.Consumer[pgx.Tx]
	stop func() error

	mu sync.Mutex
	// revoked holds the partitions given up and not assigned again.
	revoked map[int32]bool
}

func (m *kafkaMember) assigned(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range ps[m.rig.topic] {
		delete(m.revoked, p)
	}
}

func (m *kafkaMember) revoke(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range ps[m.rig.topic] {
		m.revoked[p] = true
	}
}

func (m *kafkaMember) revokedList() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ps []int32
	for p := range m.revoked {
		ps = append(ps, p)
	}
	return ps
}

// OnCommit is the member's idemkafka.CommitHook.
func (m *kafkaMember) OnCommit(_ string, p int32, offset int64, err error) {
	r := m.rig
	if err != nil {
		r.mu.Lock()
		r.commitErrs[err.Error()]++
		r.mu.Unlock()
		return
	}
	m.mu.Lock()
	revoked := m.revoked[p]
	m.mu.Unlock()
	if revoked {
		r.t.Errorf("%s had offset %d of partition %d accepted after giving the partition up", m.name, offset, p)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev := r.accepted[p]; offset < prev && !r.mayGoBack(p, offset) {
		r.t.Errorf("%s moved the committed offset of partition %d backwards: %d after %d", m.name, p, offset, prev)
	}
	r.accepted[p] = offset
	r.acceptedN++
	close(r.progress)
	r.progress = make(chan struct{})
}

// OnDataLoss is the member's idemkafka.DataLossHook.
func (m *kafkaMember) OnDataLoss(_ string, p int32, _, resetTo int64) {
	r := m.rig
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dataLosses++
	if f, ok := r.floor[p]; !ok || resetTo < f {
		r.floor[p] = resetTo
	}
}

// mayGoBack reports whether a committed offset of p may go back to offset:
// only after a reported truncation, and not below where a client resumed.
// r.mu is held.
func (r *kafkaRig) mayGoBack(p int32, offset int64) bool {
	f, ok := r.floor[p]
	return ok && offset >= f
}

func (r *kafkaRig) OnOutcome(_ string, res idem.Result, _ time.Duration) {
	if res.Outcome == idem.Applied {
		r.applied.Add(1)
	}
}

func (r *kafkaRig) processor(t *testing.T) *idem.Processor[pgx.Tx] {
	p, err := idem.NewProcessor(r.store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, Hooks: []idem.Hook{r}, Logger: r.log,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (message_id, source) VALUES ($1, $2)`, m.ID, m.Source)
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// join starts a member of the group.
func (r *kafkaRig) join(t *testing.T, name string) *kafkaMember {
	m := &kafkaMember{name: name, rig: r, revoked: map[int32]bool{}}
	opts := append(kafkatest.GroupOptions(),
		kgo.OnPartitionsAssigned(m.assigned),
		kgo.OnPartitionsRevoked(m.revoke),
		kgo.OnPartitionsLost(m.revoke),
	)
	opts = append(opts, idemkafka.GroupOptions(r.group, r.topic)...)
	cons, err := idemkafka.NewConsumer(r.client(t, opts...), r.processor(t), &idemkafka.Config{
		Hooks: []idem.Hook{m}, Logger: r.log, RebalanceGrace: 300 * time.Millisecond,
		// Small batches: many commits, so that the faults meet commits
		// in flight.
		MaxBatch: 25,
	})
	if err != nil {
		t.Fatal(err)
	}
	m.cons = cons
	m.stop = testrun.Start(t, cons, 60*time.Second)
	r.mu.Lock()
	r.members = append(r.members, m)
	r.mu.Unlock()
	return m
}

// state describes where the scenario stands, for a failure.
func (r *kafkaRig) state() string {
	var b strings.Builder
	r.mu.Lock()
	fmt.Fprintf(&b, "produced per partition:")
	for p := range int32(kafkaPartitions) {
		fmt.Fprintf(&b, " %d:%d", p, len(r.produced[p]))
	}
	fmt.Fprintf(&b, "; accepted %v; commit errors %v", r.accepted, r.commitErrs)
	members := append([]*kafkaMember(nil), r.members...)
	r.mu.Unlock()
	for _, m := range members {
		cl := m.cons.Client()
		_, gen := cl.GroupMetadata()
		fmt.Fprintf(&b, "; member %s (generation %d, paused %v, uncommitted %v, revoked %v): %+v", m.name, gen,
			cl.PauseFetchPartitions(nil), cl.UncommittedOffsets()[r.topic], m.revokedList(), m.cons.Stats())
	}
	fmt.Fprintf(&b, "; coordinator %d, leaders", r.c.CoordinatorFor(r.group))
	for p := range int32(kafkaPartitions) {
		fmt.Fprintf(&b, " %d:%d", p, r.c.LeaderFor(r.topic, p))
	}
	return b.String()
}

// waitApplied waits until n messages were applied.
func (r *kafkaRig) waitApplied(t *testing.T, n int) {
	deadline := time.Now().Add(2 * time.Minute)
	for r.applied.Load() < int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d messages applied within 2m; %s", r.applied.Load(), n, r.state())
		}
		r.mu.Lock()
		ch := r.progress
		r.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sampleCommitted reads the group's committed offsets from the broker
// until stop is closed, and fails the test if one moves backwards.
func (r *kafkaRig) sampleCommitted(t *testing.T, stop <-chan struct{}) <-chan struct{} {
	adm := kadm.NewClient(r.client(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := map[int32]int64{}
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			offs, err := adm.FetchOffsets(ctx, r.group)
			cancel()
			if err != nil {
				continue // a stopped node; the next sample tries again
			}
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Err != nil || o.Topic != r.topic {
					return
				}
				r.mu.Lock()
				back := r.mayGoBack(o.Partition, o.At)
				r.mu.Unlock()
				if o.At < last[o.Partition] && !back {
					t.Errorf("the broker's committed offset of partition %d went backwards: %d after %d", o.Partition, o.At, last[o.Partition])
				}
				last[o.Partition] = o.At
			})
		}
	}()
	return done
}

func runKafka(t *testing.T, sc kafkaScenario) {
	r := newKafkaRig(t)
	stopSampling := make(chan struct{})
	sampled := r.sampleCommitted(t, stopSampling)
	defer func() {
		close(stopSampling)
		<-sampled
	}()
	produced := r.produce(t, sc.messages)
	r.join(t, "a")
	kills := 0
	for i, f := range sc.faults {
		r.waitApplied(t, (i+1)*sc.messages/(len(sc.faults)+2))
		switch {
		case i == 0:
			r.join(t, "b")
		case sc.churn && i == 2:
			if err := r.members[1].stop(); err != nil {
				t.Errorf("member b's Run = %v", err)
			}
		case sc.churn && i == 3:
			r.join(t, "c")
		}
		kills += f(t, r)
	}
	<-produced
	if t.Failed() {
		t.FailNow()
	}

	// Every partition committed to its end, as the members saw it, and
	// still there a second later: a client that finds a truncated log
	// (kfake reports one at the first fetch after a leader change) rewinds
	// and commits again from where it resumed.
	deadline := time.After(2 * time.Minute)
	for settled := false; !settled; {
		for !r.caughtUp() {
			r.mu.Lock()
			ch := r.progress
			r.mu.Unlock()
			select {
			case <-ch:
			case <-deadline:
				t.Fatalf("the group did not commit every partition to its end within 2m; %s", r.state())
			}
		}
		r.mu.Lock()
		losses := r.dataLosses
		r.mu.Unlock()
		time.Sleep(time.Second)
		r.mu.Lock()
		settled = r.dataLosses == losses
		r.mu.Unlock()
		settled = settled && r.caughtUp()
	}
	var rebalances, commitErrors, commitRetries uint64
	for _, m := range r.members {
		if err := m.stop(); err != nil {
			t.Errorf("member %s's Run = %v", m.name, err)
		}
		s := m.cons.Stats()
		rebalances += s.Rebalances
		commitErrors += s.CommitErrors
		commitRetries += s.CommitRetries
	}

	// The broker's view.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(r.client(t))
	ends, err := adm.ListEndOffsets(ctx, r.topic)
	if err != nil {
		t.Fatalf("listing end offsets: %v", err)
	}
	committed, err := adm.FetchOffsets(ctx, r.group)
	if err != nil {
		t.Fatalf("fetching committed offsets: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ends.Each(func(e kadm.ListedOffset) {
		if int64(len(r.produced[e.Partition])) != e.Offset {
			t.Errorf("partition %d ends at %d; %d records were produced to it", e.Partition, e.Offset, len(r.produced[e.Partition]))
		}
		if c, ok := committed.Lookup(r.topic, e.Partition); !ok || c.At != e.Offset {
			t.Errorf("partition %d: committed offset %d, end offset %d", e.Partition, c.At, e.Offset)
		}
	})

	// No commit reached the coordinator before the database transactions
	// of the records below it committed.
	for _, bc := range r.brokerCommit {
		for off := range bc.offset {
			id, ok := r.produced[bc.partition][off]
			if !ok {
				t.Errorf("%s (generation %d) committed offset %d of partition %d, past its %d records", bc.member, bc.gen, bc.offset, bc.partition, len(r.produced[bc.partition]))
				break
			}
			if !bc.ledger[id] {
				t.Errorf("%s (generation %d) committed offset %d of partition %d before the effect of %s at offset %d committed", bc.member, bc.gen, bc.offset, bc.partition, id, off)
				break
			}
		}
	}

	// The database's view: one effect per message.
	rows, err := r.pool.Query(ctx, `SELECT message_id, count(*) FROM ledger GROUP BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	effects := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		effects[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	f := Figure{Scenario: sc.name, Messages: sc.messages, Kills: kills}
	ids := map[string]bool{}
	for p, offs := range r.produced {
		c, _ := committed.Lookup(r.topic, p)
		for off, id := range offs {
			if ids[id] {
				continue // a record produced twice is one message
			}
			ids[id] = true
			if off < c.At {
				f.Acked++
				if effects[id] == 0 {
					f.Lost++
				}
			}
			if effects[id] > 1 {
				f.Doubled++
			}
		}
	}
	if len(ids) != sc.messages {
		t.Errorf("%d distinct messages in the topic; %d were produced", len(ids), sc.messages)
	}
	if f.Lost != 0 || f.Doubled != 0 || f.Acked != sc.messages {
		t.Errorf("acked %d of %d messages, %d lost, %d doubled; want all acked, none lost or doubled", f.Acked, sc.messages, f.Lost, f.Doubled)
	}
	f.Note = fmt.Sprintf("kfake %d nodes, %d partitions, %d members; commits: %d reached the coordinator, %d a stopped node or a former coordinator, %d sent again by idem, %d failed; %d rebalances waited for a member; %d fetch errors, %d of them truncated logs reported (kfake's rewinds after leader changes), committed again from the reset position",
		kafkaNodes, kafkaPartitions, len(r.members), len(r.brokerCommit), r.misdirected, commitRetries, commitErrors, rebalances, r.fetchErrs.Load(), r.dataLosses)
	if sc.note != "" {
		f.Note += "; " + sc.note
	}
	if len(r.commitErrs) > 0 {
		t.Logf("commit errors seen by the members: %v", r.commitErrs)
	}
	Record(t, f)
}
