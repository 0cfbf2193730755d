// Package kafkatest starts in-process Kafka clusters (kfake) for tests and
// builds group clients with one set of group timeouts for the whole
// repository, chosen so that churn in a group (members killed, started and
// rejoining on a loaded machine) cannot stall a member.
//
// The rule behind the numbers: a member waiting in a rejoin must never
// outlive its session. kfake (like any coordinator that does not keep a
// joining member alive) keeps a known member's session timer running while
// its JoinGroup waits for the rest of the group; when the wait is longer
// than the session timeout it drops the member and never answers that
// JoinGroup, and the client sits out a whole request timeout
// (RebalanceTimeout plus RequestTimeoutOverhead) before it rejoins as a new
// member. TestRejoinOutlivingSessionIsNeverAnswered pins that chain. So
// the session timeout here is longer than the rebalance timeout (a
// rebalance waits at most the rebalance timeout for its members), and the
// request overhead is short, so that a join lost all the same costs a few
// seconds, not a quarter of a minute.
package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The group timeouts of every test client. SessionTimeout is longer than
// RebalanceTimeout (see the package documentation); RebalanceTimeout leaves
// idemkafka's default RebalanceGrace and CommitTimeout (a quarter each)
// within half of it.
const (
	SessionTimeout         = 8 * time.Second
	RebalanceTimeout       = 6 * time.Second
	HeartbeatInterval      = 300 * time.Millisecond
	RequestTimeoutOverhead = 5 * time.Second
	// FetchMaxWait keeps an idle fetch short, so that tests move on fast.
	FetchMaxWait = 100 * time.Millisecond
)

// NewCluster starts a kfake cluster of one broker (unless opts say
// otherwise) that accepts the short sessions of GroupOptions, and closes it
// when t ends.
func NewCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// GroupOptions are the group timeouts above, for a group client's options
// (after idemkafka.GroupOptions and the seed brokers; later options win).
func GroupOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(SessionTimeout),
		kgo.RebalanceTimeout(RebalanceTimeout),
		kgo.HeartbeatInterval(HeartbeatInterval),
		kgo.RequestTimeoutOverhead(RequestTimeoutOverhead),
		kgo.FetchMaxWait(FetchMaxWait),
	}
}

// RealGroupOptions are the group timeouts for a real cluster, whose brokers
// refuse sessions under 6s by default (group.min.session.timeout.ms).
func RealGroupOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(15 * time.Second),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.HeartbeatInterval(time.Second),
		kgo.RequestTimeoutOverhead(RequestTimeoutOverhead),
		kgo.FetchMaxWait(FetchMaxWait),
	}
}

// Client returns a client of brokers with opts, closed when t ends.
func Client(t testing.TB, brokers []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatalf("creating kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// CreateTopics creates each topic with n partitions on brokers.
func CreateTopics(t testing.TB, brokers []string, n int32, topics ...string) {
	t.Helper()
	cl := Client(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, topic := range topics {
		resp, err := kadm.NewClient(cl).CreateTopic(ctx, n, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating topic %s: %v", topic, err)
		}
	}
}
