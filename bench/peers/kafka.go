package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
)

func init() { brokers["kafka"] = Kafka }

// Kafka is the broker of topics of kafkaPartitions partitions, produced to
// with acks from all in-sync replicas: a real cluster when -kafka-brokers
// names one, else an in-process kfake cluster.
func Kafka() *Broker {
	return &Broker{
		Name:    "kafka",
		Prepare: prepareTopic,
		Consumers: []Consumer{
			{Key: "naive", Name: "naive batched (no guard)", Run: kafkaBatches(NaiveBatch)},
			{Key: "handrolled-msg", Name: "inbox SQL by hand, per message", Guarded: true, Run: kafkaHandOne},
			{Key: "handrolled-batch", Name: "hand-rolled batched inbox", Guarded: true, Run: kafkaBatches(HandBatch)},
			{Key: "handrolled-batch-prunable", Name: "hand-rolled batched inbox + processed_at index", Guarded: true, Run: kafkaBatches(HandBatchPrunable)},
			{Key: "watermill", Name: "Watermill router + inbox SQL in its handler", Guarded: true, Run: watermillKafka},
			{Key: "idem-msg", Name: "idem per message (Handler)", Guarded: true, Run: kafkaIdem(false, 1)},
			{Key: "idem-batch", Name: "idem batched (HandleBatch)", Guarded: true, Run: kafkaIdem(true, 1)},
			{Key: "idem-batch-2w", Name: "idem batched, 2 workers", Guarded: true, Run: kafkaIdem(true, 2)},
		},
	}
}

// kafkaPartitions is the partition count of every topic of the benchmark:
// enough that two members of one group each own some.
const kafkaPartitions = 4

// kafkaFetchMaxWait is how long a fetch of every consumer here waits for
// records when it has none, so that the tail of a run is not a wait.
const kafkaFetchMaxWait = 20 * time.Millisecond

// fake is the in-process cluster of a process without -kafka-brokers,
// started by the first run that needs it and kept for the next ones.
var fake struct {
	once    sync.Once
	cluster *kfake.Cluster
	err     error
}

// kafkaSeeds returns brokers, or the in-process cluster's addresses when
// brokers is empty.
func kafkaSeeds(brokers []string) ([]string, error) {
	if len(brokers) > 0 {
		return brokers, nil
	}
	fake.once.Do(func() {
		fake.cluster, fake.err = kfake.NewCluster(kfake.NumBrokers(1))
		if fake.err != nil {
			fake.err = fmt.Errorf("starting an in-process kfake cluster: %w", fake.err)
		}
	})
	if fake.err != nil {
		return nil, fake.err
	}
	return fake.cluster.ListenAddrs(), nil
}

// prepareTopic creates a fresh topic named run and its dead-letter topic,
// and produces w to it with acks from all in-sync replicas, keyed by the
// message ID (so that a redelivery lands on its original's partition), the
// ID also in the headers idemkafka and Watermill read it from.
func prepareTopic(ctx context.Context, opts *Options, run string, w *Workload) (string, func(), error) {
	seeds, err := kafkaSeeds(opts.Kafka)
	if err != nil {
		return "", nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return "", nil, err
	}
	defer cl.Close()
	topics := []string{run, run + ".dlq"}
	// -1: the cluster's default replication factor.
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, kafkaPartitions, -1, nil, topics...)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return "", nil, fmt.Errorf("creating topics %v: %w", topics, err)
	}
	cleanup := func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
		if err != nil {
			return
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		adm := kadm.NewClient(cl)
		_, _ = adm.DeleteTopics(ctx, topics...)
		_, _ = adm.DeleteGroups(ctx, run)
	}
	recs := make([]*kgo.Record, len(w.Msgs))
	for i, m := range w.Msgs {
		recs[i] = &kgo.Record{Topic: run, Key: []byte(m.ID), Value: m.Body, Headers: []kgo.RecordHeader{
			{Key: idemkafka.DefaultIDHeader, Value: []byte(m.ID)},
			// Watermill's marshaler reads a message's UUID from this header.
			{Key: "_watermill_message_uuid", Value: []byte(m.ID)},
		}}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("producing to %s: %w", run, err)
	}
	return run, cleanup, nil
}

// groupClient is the client of the hand-written consumers: e's group on
// e's topic, offsets committed by hand and rebalances held while a poll is
// processed, as a careful team configures franz-go.
func groupClient(e *Env) (*kgo.Client, error) {
	seeds, err := kafkaSeeds(e.Kafka)
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.ConsumerGroup(e.Consumer),
		kgo.ConsumeTopics(e.Source),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxWait(kafkaFetchMaxWait),
	)
}

// closeGroup leaves the group and closes cl. A client that blocks
// rebalances on poll cannot leave before the poll it returned last is
// allowed to give its partitions up.
func closeGroup(cl *kgo.Client) {
	cl.AllowRebalance()
	cl.Close()
}

// poll takes up to e.Prefetch records; done reports that ctx ended.
func poll(ctx context.Context, cl *kgo.Client, e *Env) (recs []*kgo.Record, done bool, err error) {
	fs := cl.PollRecords(ctx, e.Prefetch)
	if ctx.Err() != nil {
		return nil, true, nil
	}
	if fs.IsClientClosed() {
		return nil, false, kgo.ErrClientClosed
	}
	if errs := fs.Errors(); len(errs) > 0 {
		return nil, false, fmt.Errorf("fetching %s/%d: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
	}
	return fs.Records(), false, nil
}

func msgs(recs []*kgo.Record) []Msg {
	ms := make([]Msg, len(recs))
	for i, r := range recs {
		ms[i] = Msg{ID: string(r.Key), Body: r.Value}
	}
	return ms
}

// kafkaBatches is a hand-written batching consumer: each poll cut into
// batches of up to e.Batch records, one call of apply for each, then a
// synchronous commit of the batch's offsets, after the database commit.
func kafkaBatches(apply func(context.Context, *pgxpool.Pool, string, []Msg) error) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		cl, err := groupClient(e)
		if err != nil {
			return err
		}
		defer closeGroup(cl)
		for {
			recs, done, err := poll(ctx, cl, e)
			if done || err != nil {
				return err
			}
			for len(recs) > 0 {
				batch := recs[:min(len(recs), e.Batch)]
				recs = recs[len(batch):]
				if err := apply(ctx, e.Pool, e.Consumer, msgs(batch)); err != nil {
					return stopped(ctx, err)
				}
				if err := cl.CommitRecords(ctx, batch...); err != nil {
					return stopped(ctx, err)
				}
				e.Acked(len(batch))
			}
			cl.AllowRebalance()
		}
	}
}

// kafkaHandOne is the per-message consumer: the inbox SQL by hand, then a
// synchronous commit of that record's offset.
func kafkaHandOne(ctx context.Context, e *Env) error {
	cl, err := groupClient(e)
	if err != nil {
		return err
	}
	defer closeGroup(cl)
	for {
		recs, done, err := poll(ctx, cl, e)
		if done || err != nil {
			return err
		}
		for _, r := range recs {
			if err := HandOne(ctx, e.Pool, e.Consumer, Msg{ID: string(r.Key), Body: r.Value}); err != nil {
				return stopped(ctx, err)
			}
			if err := cl.CommitRecords(ctx, r); err != nil {
				return stopped(ctx, err)
			}
			e.Acked(1)
		}
		cl.AllowRebalance()
	}
}

// stopped is nil when err is ctx's end, else err.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// kafkaIdem is idemkafka with the effect through idem.JSON (one record per
// transaction) or idem.JSONBatch (up to e.Batch records of a partition per
// transaction). idemkafka has no worker count: a consumer applies the
// partitions of a poll in parallel, one worker each. Its "workers" here
// are members of one group in one process, each with its own client and
// its share of the partitions.
func kafkaIdem(batched bool, members int) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		proc, err := Processor(e.Store, e.Consumer, batched)
		if err != nil {
			return err
		}
		seeds, err := kafkaSeeds(e.Kafka)
		if err != nil {
			return err
		}
		batch := 1
		if batched {
			batch = e.Batch
		}
		cs := make([]*idemkafka.Consumer[pgx.Tx], 0, members)
		for range members {
			c, err := idemkafka.New(idemkafka.ClientConfig{Brokers: seeds, Group: e.Consumer, Topics: []string{e.Source},
				Options: []kgo.Opt{kgo.FetchMaxWait(kafkaFetchMaxWait)}},
				proc, &idemkafka.Config{MaxBatch: batch, MaxPollRecords: e.Prefetch, Hooks: []idem.Hook{settled{e}}, Logger: quiet})
			if err != nil {
				for _, c := range cs {
					c.Client().Close()
				}
				return err
			}
			cs = append(cs, c)
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errc := make(chan error, len(cs))
		for _, c := range cs {
			go func() {
				err := c.Run(ctx)
				if err != nil {
					cancel() // one member failed: the run failed
				}
				errc <- err
			}()
		}
		var errs []error
		for range cs {
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
}
