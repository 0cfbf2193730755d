package idemkafka

import (
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ClientConfig is the small configuration [New] builds a client from.
type ClientConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Group is the consumer group. Required.
	Group string
	// Topics are the topics to consume. Required.
	Topics []string
	// Options are further client options (TLS, SASL, session and rebalance
	// timeouts), applied before the ones idemkafka requires.
	Options []kgo.Opt
}

// GroupOptions returns the options every client given to [NewConsumer] must
// carry: the consumer group and its topics, auto-commit disabled (offsets are
// committed only after the database commit), rebalances blocked while a
// poll is being processed (so that a partition is never revoked with a batch
// in flight), and the signal that a rebalance waits for the consumer (so
// that it gives its partitions up in time; see [Config.RebalanceGrace]).
// Append them to your own options when you build the client, after any
// OnPartitionsCallbackBlocked of your own.
func GroupOptions(group string, topics ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsCallbackBlocked(rebalanceWaiting),
	}
}

// ErrClientUnsafe is wrapped by the error [NewConsumer] returns for a client
// whose settings would let an offset be committed before, or without, the
// database commit.
var ErrClientUnsafe = errors.New("kafka client is unsafe for idemkafka")

// checkClient refuses a client that could commit offsets on its own or
// across a rebalance.
func checkClient(cl *kgo.Client) error {
	if cl == nil {
		return fmt.Errorf("%w: client is nil", ErrConfig)
	}
	var errs []error
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		errs = append(errs, errors.New("no consumer group (add kgo.ConsumerGroup): offsets can only be committed in a group"))
	}
	if off, _ := cl.OptValue(kgo.DisableAutoCommit).(bool); !off {
		errs = append(errs, errors.New("auto-commit is on (add kgo.DisableAutoCommit): it would commit offsets before the database commit"))
	}
	if block, _ := cl.OptValue(kgo.BlockRebalanceOnPoll).(bool); !block {
		errs = append(errs, errors.New("rebalances are not blocked on poll (add kgo.BlockRebalanceOnPoll): a partition could be revoked with a batch in flight and its late commit would move the new owner's offset backwards"))
	}
	if fn := cl.OptValue(kgo.OnPartitionsCallbackBlocked); reflect.ValueOf(fn).Pointer() != reflect.ValueOf(rebalanceWaiting).Pointer() {
		errs = append(errs, errors.New("the client does not tell idemkafka when a rebalance waits for it (kgo.OnPartitionsCallbackBlocked is missing or not idemkafka's): a retried record could hold the rebalance past its timeout"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w (use idemkafka.GroupOptions): %w", ErrClientUnsafe, errors.Join(errs...))
	}
	return nil
}

// checkDeadLetterClient refuses a producer of dead letters whose records
// could be lost after the broker acknowledged them: the offset of the
// original moves past it on that acknowledgement.
func checkDeadLetterClient(cl *kgo.Client) error {
	if acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		return fmt.Errorf("%w: the dead-letter producer does not require acks from all in-sync replicas (kgo.RequiredAcks(kgo.AllISRAcks()), the default): a dead letter could be lost after the offset moved past it", ErrClientUnsafe)
	}
	return nil
}

// rebalanceTimeout is the client's rebalance timeout: how long the group
// waits for its members to rejoin.
func rebalanceTimeout(cl *kgo.Client) time.Duration {
	if d, _ := cl.OptValue(kgo.RebalanceTimeout).(time.Duration); d > 0 {
		return d
	}
	return time.Minute
}
