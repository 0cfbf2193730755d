package clusterfault

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/internal/testrun"
)

// redisScenario is a Redis primary with one asynchronous replica, killed
// with SIGKILL under a running publisher and consumer; the replica is
// promoted (REPLICAOF NO ONE) and both clients follow it.
type redisScenario struct {
	name     string
	messages int
	// killAt is how many messages the consumer settled when the fault
	// starts. behind, when positive, freezes the replication link first
	// (a slow or partitioned replica) and kills the primary once it
	// acknowledged behind more entries that the replica never gets.
	killAt  int
	behind  int
	timeout time.Duration
}

// redisFollower stands in for what finds the primary in production
// (Sentinel, redis.NewFailoverClient, a DNS name moved by the operator):
// every client it makes dials the address it holds now, and the test
// moves it to the promoted replica.
type redisFollower struct {
	t    testing.TB
	addr atomic.Value // string
}

func (f *redisFollower) client() *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:        f.addr.Load().(string),
		DialTimeout: 2 * time.Second,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, f.addr.Load().(string))
		},
	})
	f.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// waitUntil polls cond every 20ms until it holds or d passed, and reports
// whether it held.
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// appliedCount is how many messages were applied.
func (r *rabbitResults) appliedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applied
}

// settled is how many results the processor returned.
func (r *rabbitResults) settled() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applied + r.duplicates + r.other
}

// runRedisScenario publishes sc.messages entries (IDs entry-000000..) to
// a stream on the primary while an idemredis consumer applies them to a
// PostgreSQL ledger, kills the primary with SIGKILL mid-stream, promotes
// the replica and points both clients at it, and records what the ledger
// and the promoted stream say once everything in it was acked. The
// publisher publishes each entry until some primary answered its XADD,
// as an outbox relay does; it does not wait for the replica (no WAIT).
func runRedisScenario(t *testing.T, sc redisScenario) {
	ctx := context.Background()
	primary := redistest.Start(t)
	link := netfault.New(t, primary.Addr) // the replica's replication link
	host, port, err := net.SplitHostPort(link.Addr())
	if err != nil {
		t.Fatal(err)
	}
	replica := redistest.Start(t, "--replicaof", host, port, "--repl-timeout", "600")
	admin, radmin := primary.Client(nil), replica.Client(nil)

	stream := "idem-clusterfault-" + fmt.Sprint(time.Now().UnixNano())
	if err := admin.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, admin, stream+".dlq"); err != nil {
		t.Fatal(err)
	}
	if !waitUntil(60*time.Second, func() bool {
		n, err := admin.Wait(ctx, 1, time.Second).Result()
		return err == nil && n >= 1
	}) {
		t.Fatalf("the replica did not sync with the primary within 60s: %s", redisInfo(radmin, "master_link_status"))
	}

	f := &redisFollower{t: t}
	f.addr.Store(primary.Addr)
	led := newRabbitLedger(t)
	res := &rabbitResults{}
	// The kill, once armed, lands between a batch's COMMIT and its XACK,
	// on the consumer's goroutine: the XACK meets a dead primary.
	var armed atomic.Bool
	killed := make(chan int, 1)
	c, err := idemredis.New(f.client(), led.processor(t, res), &idemredis.Config{
		Stream: stream, Group: "g", Name: "ledger-1", BatchSize: 50,
		Block: 200 * time.Millisecond, ClaimIdle: time.Second, ClaimEvery: 500 * time.Millisecond,
		Backoff: idem.Backoff{Initial: 50 * time.Millisecond, Max: time.Second},
		Logger:  rabbitQuiet,
		Faults: func(_ context.Context, _ idem.FaultPoint, _ string, ids []string) error {
			if armed.CompareAndSwap(true, false) {
				primary.Kill()
				killed <- len(ids)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := testrun.Start(t, c, 30*time.Second)

	// The publisher stays at most window entries ahead of the consumer,
	// so that the fault lands mid-stream whatever the machine's speed,
	// until the replication link froze.
	const chunk, window = 20, 300
	if sc.killAt+window+chunk+sc.behind > sc.messages {
		t.Fatalf("scenario: %d messages cannot leave %d to publish after the fault at %d settled (the publisher runs up to %d ahead)", sc.messages, sc.behind, sc.killAt, window+chunk)
	}
	ids := make([]string, sc.messages)
	for i := range ids {
		ids[i] = fmt.Sprintf("entry-%06d", i)
	}
	var published atomic.Int64 // entries some primary answered, in order
	var frozen atomic.Bool     // once the link froze, the publisher runs freely
	var pubErrors atomic.Int64
	pubDone := make(chan error, 1)
	pub := f.client()
	go func() {
		for from := 0; from < len(ids); from += chunk {
			for !frozen.Load() && from-res.settled() > window {
				if time.Since(start) > sc.timeout {
					pubDone <- fmt.Errorf("the consumer settled %d of %d published entries within %v", res.settled(), from, sc.timeout)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			to := min(from+chunk, len(ids))
			for {
				_, err := pub.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, id := range ids[from:to] {
						p.XAdd(ctx, &redis.XAddArgs{Stream: stream, NoMkStream: true,
							Values: []any{idemredis.DefaultIDField, id, idemredis.DefaultBodyField, `{"amount":100}`}})
					}
					return nil
				})
				if err == nil {
					break
				}
				pubErrors.Add(1)
				if time.Since(start) > sc.timeout {
					pubDone <- fmt.Errorf("publishing %s: %w", ids[from], err)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			published.Store(int64(to))
		}
		pubDone <- nil
	}()

	var notes []string
	if !waitUntil(sc.timeout, func() bool { return res.settled() >= sc.killAt }) {
		t.Fatalf("only %d of %d entries settled before the fault, after %v", res.settled(), sc.messages, sc.timeout)
	}
	if sc.behind > 0 {
		link.Freeze()
		frozen.Store(true)
		from := published.Load()
		if !waitUntil(sc.timeout, func() bool { return published.Load() >= from+int64(sc.behind) }) {
			t.Fatalf("the primary acknowledged %d entries after the replication link froze; want %d", published.Load()-from, sc.behind)
		}
		notes = append(notes, fmt.Sprintf("replication link frozen at %d published, %d settled", from, res.settled()))
	}
	armed.Store(true)
	var inHand int
	select {
	case inHand = <-killed:
	case <-time.After(sc.timeout):
		t.Fatalf("no batch committed within %v of arming the kill", sc.timeout)
	}
	atKill, settledAtKill := published.Load(), res.settled()
	if err := radmin.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatalf("promoting the replica: %v", err)
	}
	f.addr.Store(replica.Addr)
	killedAt := time.Now()
	notes = append(notes, fmt.Sprintf("primary killed -9 between a batch's COMMIT and its XACK (%d entries) at %d published, %d settled; replica promoted, clients' dialer moved to it",
		inHand, atKill, settledAtKill))

	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	// Drained: every entry of the promoted stream delivered to the group
	// and acked.
	drained := waitUntil(sc.timeout, func() bool {
		s, err := radmin.XInfoStream(ctx, stream).Result()
		if err != nil {
			return false
		}
		gs, err := radmin.XInfoGroups(ctx, stream).Result()
		if err != nil || len(gs) != 1 {
			return false
		}
		return gs[0].Pending == 0 && gs[0].LastDeliveredID == s.LastGeneratedID
	})
	elapsed := time.Since(start)
	if err := stop(); err != nil {
		t.Errorf("stopping the consumer: %v", err)
	}
	if !drained {
		t.Errorf("the promoted stream was not drained within %v", sc.timeout)
	}

	entries, err := radmin.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	inStream := map[string]bool{}
	for _, e := range entries {
		if id, ok := e.Values[idemredis.DefaultIDField].(string); ok {
			inStream[id] = true
		}
	}
	var gone []string
	for _, id := range ids {
		if !inStream[id] {
			gone = append(gone, id)
		}
	}
	dead, err := radmin.XLen(ctx, stream+".dlq").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, lost, doubled := led.counts(t, ids)
	// lost are the published entries with no effect; lostInStream those
	// of them still in the promoted stream, which the consumer must
	// apply.
	per := ledgerPer(t, led)
	lostInStream := 0
	for id := range inStream {
		if per[id] == 0 {
			lostInStream++
		}
	}
	st := c.Stats()
	notes = append(notes, fmt.Sprintf("%d acknowledged entries not on the promoted replica (%d of them applied before the kill); "+
		"%d dead-lettered; %s; consumer: %d taken over, %d XACKs failed; publisher retried %d pipelines; drained in %v (%v after the kill)",
		len(gone), len(gone)-lost, dead, res, st.Claimed, st.AckErrors, pubErrors.Load(),
		elapsed.Round(100*time.Millisecond), time.Since(killedAt).Round(100*time.Millisecond)))
	Record(t, Figure{
		Scenario: sc.name,
		Messages: sc.messages,
		Kills:    1,
		Acked:    len(inStream),
		Lost:     lost,
		Doubled:  doubled,
		Note:     strings.Join(notes, "; "),
	})
	if doubled > 0 {
		t.Errorf("%d messages applied more than once; want none", doubled)
	}
	if lostInStream > 0 {
		t.Errorf("%d entries of the promoted stream were never applied; want every one applied", lostInStream)
	}
	if dead != 0 || st.DeadLettered != 0 {
		t.Errorf("%d dead letters (stats %d); want none", dead, st.DeadLettered)
	}
	if sc.behind > 0 && len(gone) < sc.behind {
		t.Errorf("%d acknowledged entries missing from the promoted stream; want at least the %d published while the link was frozen", len(gone), sc.behind)
	}
}

// ledgerPer is the ledger's rows by message ID.
func ledgerPer(t testing.TB, l *rabbitLedger) map[string]int {
	t.Helper()
	rows, err := l.pool.Query(context.Background(), `SELECT message_id, count(*) FROM ledger GROUP BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
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
	return per
}

// redisInfo is the line of INFO replication that starts with key.
func redisInfo(rdb *redis.Client, key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return err.Error()
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, key+":") {
			return strings.TrimSpace(l)
		}
	}
	return key + " not reported"
}

// The full cases (IDEM_CLUSTER=1): a primary and an asynchronous replica
// (redis-server processes of the test's own), the primary killed with
// SIGKILL mid-stream, the replica promoted. With the replica streaming,
// few or no acknowledged entries are lost; with the replication link
// frozen before the kill (a replica behind), every entry the primary
// acknowledged after the freeze is gone from the promoted stream. The
// inbox turns every replayed entry (an XACK or a delivery the replica
// never got) into a Duplicate: nothing is applied twice and nothing
// dead-lettered; what is gone from the stream is lost to every consumer.
func TestRedisPrimaryKilledReplicaPromoted(t *testing.T) {
	if !Full() {
		t.Skip("the Redis failover runs with IDEM_CLUSTER=1 (make cluster-faults)")
	}
	for _, sc := range []redisScenario{
		{name: "redis/async: primary killed -9, replica promoted, replica streaming", messages: 3000, killAt: 1000, timeout: 3 * time.Minute},
		{name: "redis/async: primary killed -9, replica promoted, replica behind", messages: 3000, killAt: 1000, behind: 200, timeout: 3 * time.Minute},
	} {
		t.Run(sc.name[len("redis/async: "):], func(t *testing.T) { runRedisScenario(t, sc) })
	}
}

// The smoke case, in make test: the failover with the replica behind, on
// a short stream. Two redis-server processes start in well under a
// second; the test is skipped where redis-server is not installed.
func TestRedisSmokePrimaryKilledReplicaBehind(t *testing.T) {
	runRedisScenario(t, redisScenario{name: "redis/smoke: primary killed -9, replica behind, promoted", messages: 1000, killAt: 150, behind: 100, timeout: 2 * time.Minute})
}
