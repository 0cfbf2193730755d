package demo

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
)

// kafkaPartitions is the partition count of each topic: consumers work
// partitions in parallel, so the restart catches one batch per partition.
const kafkaPartitions = 4

type kafkaTransport struct {
	brokers []string
	fake    *kfake.Cluster
	suffix  string
	log     *slog.Logger
	admin   *kgo.Client
	ends    map[string]map[int32]int64 // stream → partition → end offset
}

// newKafka connects to brokers, or starts an in-process kfake cluster when
// there are none.
func newKafka(brokers []string, log *slog.Logger) (*kafkaTransport, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	k := &kafkaTransport{brokers: brokers, suffix: hex.EncodeToString(b[:]), log: log, ends: map[string]map[int32]int64{}}
	if len(brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(),
			kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("starting the in-process Kafka: %w", err)
		}
		k.fake, k.brokers = c, c.ListenAddrs()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers...), kgo.ProducerLinger(0))
	if err != nil {
		k.close(context.Background())
		return nil, fmt.Errorf("creating Kafka client: %w", err)
	}
	k.admin = cl
	return k, nil
}

func (k *kafkaTransport) describe() string {
	if k.fake != nil {
		return "Kafka (in-process kfake)"
	}
	return "Kafka " + strings.Join(k.brokers, ",")
}

func (k *kafkaTransport) topic(stream string) string { return "idem-demo-" + stream + "-" + k.suffix }

func (k *kafkaTransport) prepare(ctx context.Context, _ *plan) error {
	adm := kadm.NewClient(k.admin)
	for _, s := range streams {
		for _, t := range []string{k.topic(s), k.topic(s) + ".dlq"} {
			resp, err := adm.CreateTopic(ctx, kafkaPartitions, -1, nil, t)
			if err == nil {
				err = resp.Err
			}
			if err != nil {
				return fmt.Errorf("creating topic %s: %w", t, err)
			}
		}
	}
	return nil
}

func (k *kafkaTransport) publish(ctx context.Context, p *plan) error {
	for _, s := range streams {
		ends := map[int32]int64{}
		evs := p.stream[s]
		for start := 0; start < len(evs); start += 1000 {
			recs := make([]*kgo.Record, 0, 1000)
			for _, ev := range evs[start:min(start+1000, len(evs))] {
				recs = append(recs, idemkafka.NewRecord(k.topic(s), ev.id, []byte(ev.key), ev.body))
			}
			res := k.admin.ProduceSync(ctx, recs...)
			if err := res.FirstErr(); err != nil {
				return fmt.Errorf("publishing to %s: %w", k.topic(s), err)
			}
			for _, r := range res {
				ends[r.Record.Partition] = max(ends[r.Record.Partition], r.Record.Offset+1)
			}
		}
		k.ends[s] = ends
	}
	return nil
}

func (k *kafkaTransport) start(ctx context.Context, s *side, stream string, proc *idem.Processor[*sql.Tx], o *outage, published int) runningConsumer {
	c := &kafkaConsumer{ends: k.ends[stream], committed: map[int32]int64{}, base: map[int32]int64{}, done: make(chan struct{})}
	group := "idem-demo-" + s.name + "-" + stream + "-" + k.suffix
	// A batch per partition is what a restart catches in flight: size the
	// batches so that the partitions together hold about the outage's share.
	maxBatch := max(1, (o.target+kafkaPartitions-1)/kafkaPartitions)
	session, rebalance := 3*time.Second, 6*time.Second
	if k.fake == nil {
		session, rebalance = 6*time.Second, 10*time.Second // brokers refuse sessions under 6 s by default
	}
	go func() {
		defer close(c.done)
		// Each pass is one member of the group; after the restart a new
		// member takes the partitions over from their committed offsets.
		for ctx.Err() == nil {
			cl, err := kgo.NewClient(append([]kgo.Opt{
				kgo.SeedBrokers(k.brokers...),
				kgo.SessionTimeout(session),
				kgo.RebalanceTimeout(rebalance),
				kgo.HeartbeatInterval(300 * time.Millisecond),
				kgo.FetchMaxWait(100 * time.Millisecond),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			}, idemkafka.GroupOptions(group, k.topic(stream))...)...)
			if err != nil {
				c.err = fmt.Errorf("creating consumer client: %w", err)
				return
			}
			cons, err := idemkafka.NewConsumer(cl, proc, &idemkafka.Config{
				MaxBatch: maxBatch,
				Hooks:    []idem.Hook{c},
				Logger:   k.log,
				Faults: func(ctx context.Context, _ idem.FaultPoint, _ string, partition int32, offset int64) error {
					return o.hold(ctx, c.advance(partition, offset))
				},
			})
			if err != nil {
				cl.Close()
				c.err = err
				return
			}
			err = cons.Run(ctx)
			cl.Close()
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, idemkafka.ErrCrashed) {
				c.err = fmt.Errorf("consuming %s: %w", k.topic(stream), err)
				return
			}
		}
	}()
	return c
}

func (k *kafkaTransport) close(context.Context) {
	if k.admin != nil {
		k.admin.Close()
	}
	if k.fake != nil {
		k.fake.Close()
	}
}

// kafkaConsumer follows one group's offset commits.
type kafkaConsumer struct {
	mu        sync.Mutex
	ends      map[int32]int64
	committed map[int32]int64
	base      map[int32]int64 // offset reached by the last batch seen at the fault seam
	done      chan struct{}
	err       error
}

// advance returns how many records the batch ending at offset holds.
func (c *kafkaConsumer) advance(partition int32, offset int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := offset - max(c.base[partition], c.committed[partition])
	c.base[partition] = offset
	return int(max(n, 0))
}

// OnCommit implements idemkafka.CommitHook.
func (c *kafkaConsumer) OnCommit(_ string, partition int32, offset int64, err error) {
	if err != nil {
		return
	}
	c.mu.Lock()
	c.committed[partition] = max(c.committed[partition], offset)
	c.mu.Unlock()
}

func (c *kafkaConsumer) acked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int64(0)
	for _, o := range c.committed {
		n += o
	}
	return int(n)
}

func (c *kafkaConsumer) finished() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, end := range c.ends {
		if c.committed[p] < end {
			return false
		}
	}
	return true
}

func (c *kafkaConsumer) wait() error {
	<-c.done
	return c.err
}
