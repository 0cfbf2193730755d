package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// DefaultGroup is the consumer group whose committed offsets mark how far
// a Kafka dead-letter topic has been settled.
const DefaultGroup = "idem-dlq"

// KafkaConfig names a Kafka dead-letter topic.
type KafkaConfig struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Topic is the dead-letter topic ("billing.dlq"). Required.
	Topic string
	// Group is the consumer group whose committed offsets say where the
	// letters not yet redriven or purged begin. Defaults to [DefaultGroup].
	Group string
	// IDHeader is the header with the message ID (idemkafka.Config.IDHeader).
	// Defaults to "idem-message-id".
	IDHeader string
	// TimeHeader is the producer's event-time header. Defaults to
	// "x-event-time".
	TimeHeader string
	// Target is where letters that name no origin are redriven to. Empty:
	// such letters are refused.
	Target string
	// Opts are more client options (TLS, SASL). The producer keeps
	// franz-go's defaults: acks from all in-sync replicas, idempotent.
	Opts []kgo.Opt
}

// Kafka is a dead-letter topic. A topic cannot delete one record: the
// letters that are settled (redriven, purged) are those before the offsets
// committed for [KafkaConfig.Group], and a walk commits, per partition, up
// to the first letter it keeps.
type Kafka struct {
	cfg KafkaConfig
	cl  *kgo.Client
	adm *kadm.Client

	// afterProduce runs between the redrive's acks and the offset commit
	// (fault injection in tests).
	afterProduce func(*Letter)

	mu       sync.Mutex
	warnings []string
}

// Warnings says what the last read found that an operator must know:
// letters the topic's retention deleted before anyone settled them.
func (k *Kafka) Warnings() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.warnings)
}

// NewKafka connects to the cluster and checks that the topic exists.
func NewKafka(ctx context.Context, cfg KafkaConfig) (*Kafka, error) {
	if len(cfg.Brokers) == 0 || cfg.Topic == "" {
		return nil, errors.New("dlq: Kafka needs brokers and a topic")
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.IDHeader == "" {
		cfg.IDHeader = idembroker.HeaderMessageID
	}
	if cfg.TimeHeader == "" {
		cfg.TimeHeader = idembroker.HeaderEventTime
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.RequiredAcks(kgo.AllISRAcks())}, cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to Kafka: %w", err)
	}
	k := &Kafka{cfg: cfg, cl: cl, adm: kadm.NewClient(cl)}
	td, err := k.adm.ListTopics(ctx, cfg.Topic)
	if err == nil {
		err = td.Error()
	}
	if err == nil && !td.Has(cfg.Topic) {
		err = errors.New("no such topic")
	}
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("dead-letter topic %s: %w", cfg.Topic, err)
	}
	return k, nil
}

// Name says which topic.
func (k *Kafka) Name() string { return "kafka topic " + k.cfg.Topic }

// Close closes the client.
func (k *Kafka) Close() error { k.cl.Close(); return nil }

// bounds returns, per partition, the first unsettled offset and the end.
func (k *Kafka) bounds(ctx context.Context) (from, end map[int32]int64, err error) {
	ends, err := k.adm.ListEndOffsets(ctx, k.cfg.Topic)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the end of %s: %w", k.cfg.Topic, err)
	}
	starts, err := k.adm.ListStartOffsets(ctx, k.cfg.Topic)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the start of %s: %w", k.cfg.Topic, err)
	}
	committed, err := k.adm.FetchOffsets(ctx, k.cfg.Group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		// Nothing settled yet.
		committed, err = nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fetching the offsets of group %s: %w", k.cfg.Group, err)
	}
	from, end = map[int32]int64{}, map[int32]int64{}
	var lerr error
	var lost int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			lerr = o.Err
			return
		}
		end[o.Partition] = o.Offset
		var settled int64
		if c, ok := committed.Lookup(k.cfg.Topic, o.Partition); ok && c.Err == nil && c.At > 0 {
			settled = c.At
		}
		from[o.Partition] = settled
		if s, ok := starts.Lookup(k.cfg.Topic, o.Partition); ok && s.Err == nil && s.Offset > settled {
			// The retention deleted letters nobody settled.
			from[o.Partition] = s.Offset
			lost += s.Offset - settled
		}
	})
	k.mu.Lock()
	k.warnings = nil
	if lost > 0 {
		k.warnings = append(k.warnings, fmt.Sprintf("%d letters of %s were deleted by the topic's retention before they were redriven or purged (the group %s had not settled them): give dead-letter topics a retention longer than the time to act on them", lost, k.cfg.Topic, k.cfg.Group))
	}
	k.mu.Unlock()

	if lerr != nil {
		return nil, nil, fmt.Errorf("listing the offsets of %s: %w", k.cfg.Topic, lerr)
	}
	return from, end, nil
}

// quietPoll is how long a read waits for records it knows are there.
const quietPoll = 10 * time.Second

// read returns the records between from and end, by partition then offset.
func (k *Kafka) read(ctx context.Context, from, end map[int32]int64, limit int) ([]*kgo.Record, error) {
	want := map[int32]kgo.Offset{}
	left := 0
	for p, f := range from {
		if f < end[p] {
			want[p] = kgo.NewOffset().At(f)
			left += int(end[p] - f)
		}
	}
	if left == 0 {
		return nil, nil
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(k.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{k.cfg.Topic: want}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted())}, k.cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	reached := map[int32]bool{}
	for len(reached) < len(want) {
		// A partition whose last offsets hold no record (transaction
		// markers) never shows its end: a quiet poll ends the read. What
		// was not read is neither listed nor settled.
		pctx, cancel := context.WithTimeout(ctx, quietPoll)
		fs := cl.PollFetches(pctx)
		quiet := pctx.Err() != nil
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if quiet && fs.NumRecords() == 0 {
			break
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		if ferr != nil {
			return nil, fmt.Errorf("reading %s: %w", k.cfg.Topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < end[r.Partition] {
				out = append(out, r)
			}
			if r.Offset >= end[r.Partition]-1 {
				reached[r.Partition] = true
			}
		})
	}
	slices.SortFunc(out, func(a, b *kgo.Record) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (k *Kafka) letter(r *kgo.Record) Letter {
	h := make(map[string]string, len(r.Headers))
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	id := h[k.cfg.IDHeader]
	var header time.Time
	if v, ok := h[k.cfg.TimeHeader]; ok {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
			header = time.UnixMilli(ms)
		} else if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			header = t
		}
	}
	t, src := idem.EventTime(id, header, r.Timestamp)
	e := idembroker.ReadEnvelope(h)
	l := Letter{
		ID: id, DLQ: r.Topic, Position: strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10),
		Reason: e.Reason, Outcome: e.Outcome, Consumer: e.Consumer, Attempts: e.Attempts,
		Origin: e.Origin, Redriven: e.Redriven, Time: t, TimeSource: src, TimeFrom: src.String(),
		Key: string(r.Key), Headers: h, Body: r.Value,
	}
	if l.Reason == "" {
		l.Reason = "unknown"
	}
	// topic/partition/offset; a topic name has no slash.
	if topic, _, ok := strings.Cut(l.Origin, "/"); ok {
		l.Target = topic
	}
	if l.Target == "" {
		l.Target = k.cfg.Target
	}
	return l
}

// Peek reads the unsettled letters (at most limit; 0: all).
func (k *Kafka) Peek(ctx context.Context, limit int) ([]Letter, error) {
	from, end, err := k.bounds(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := k.read(ctx, from, end, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Letter, 0, len(rs))
	for _, r := range rs {
		out = append(out, k.letter(r))
	}
	return out, nil
}

// Walk hands the unsettled letters to decide. A Send is produced to its
// target with the record's key, value, timestamp and headers (minus the
// dead-letter ones, plus the redrive count) and waits for acks=all. Then
// the group's offset of each partition is committed up to the first letter
// kept: the letters before it are settled.
func (k *Kafka) Walk(ctx context.Context, limit int, decide func(*Letter) (Action, error), done func(*Letter, Action, bool)) error {
	from, end, err := k.bounds(ctx)
	if err != nil {
		return err
	}
	rs, err := k.read(ctx, from, end, limit)
	if err != nil {
		return err
	}
	type settled struct {
		l   *Letter
		a   Action
		off int64
		p   int32
	}
	var acted []settled
	kept := map[int32]int64{} // first offset kept, per partition
	upto := map[int32]int64{} // offset after the last letter looked at
	var werr error
	for _, r := range rs {
		if werr = ctx.Err(); werr != nil {
			break
		}
		l := k.letter(r)
		act, err := decide(&l)
		if err != nil {
			werr = err
			break
		}
		if act == Send {
			if l.Target == "" {
				werr = fmt.Errorf("letter %q names no origin topic to redrive to", l.ID)
				break
			}
			if err := k.cl.ProduceSync(ctx, k.redrive(r, &l)).FirstErr(); err != nil {
				werr = fmt.Errorf("producing %q to %s: %w", l.ID, l.Target, err)
				break
			}
			if k.afterProduce != nil {
				k.afterProduce(&l)
			}
		}
		upto[r.Partition] = r.Offset + 1
		if act == Keep {
			if _, ok := kept[r.Partition]; !ok {
				kept[r.Partition] = r.Offset
			}
			continue
		}
		acted = append(acted, settled{&l, act, r.Offset, r.Partition})
	}
	// Commit, per partition, up to the first kept letter, or past the last
	// one looked at.
	var offs kadm.Offsets
	commit := map[int32]int64{}
	for p, u := range upto {
		at := u
		if kk, ok := kept[p]; ok {
			at = kk
		}
		if at > from[p] {
			commit[p] = at
			offs.Add(kadm.Offset{Topic: k.cfg.Topic, Partition: p, At: at, LeaderEpoch: -1})
		}
	}
	committed := len(offs) == 0
	if !committed {
		// The letters before the commit were produced and acked: settle
		// them even when the walk was interrupted, or the next redrive
		// sends them all again.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
		resp, err := k.adm.CommitOffsets(cctx, k.cfg.Group, offs)
		cancel()
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			werr = errors.Join(werr, fmt.Errorf("committing the offsets of group %s on %s (the letters stay; a redrive sent again is absorbed by the inbox, a replay of them is refused as already replayed): %w", k.cfg.Group, k.cfg.Topic, err))
		} else {
			committed = true
		}
	}
	for _, s := range acted {
		report(done, s.l, s.a, committed && s.off < commit[s.p])
	}
	return werr
}

// commitTimeout bounds the offset commit that ends a walk, which runs even
// when the walk was interrupted.
const commitTimeout = 30 * time.Second

// redrive is the record a redrive of r produces.
func (k *Kafka) redrive(r *kgo.Record, l *Letter) *kgo.Record {
	h := make([]kgo.RecordHeader, 0, len(r.Headers)+1)
	for _, x := range r.Headers {
		if !deadLetterHeader(x.Key) {
			h = append(h, x)
		}
	}
	h = append(h, kgo.RecordHeader{Key: idembroker.HeaderRedriven, Value: []byte(strconv.Itoa(l.Redriven + 1))})
	return &kgo.Record{Topic: l.Target, Key: r.Key, Value: r.Value, Headers: h, Timestamp: r.Timestamp}
}
