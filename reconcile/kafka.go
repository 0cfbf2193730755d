package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/outbox"
)

// Kafka is a topic as a source: the records of a time range (the records'
// timestamps, Range) or of an offset range, read with a client of its own
// that joins no group and commits nothing. Each record becomes the message
// an idemkafka consumer receives: the ID from the ID header, the event time
// from the ID, the time header or the record's timestamp, the headers, and
// the value, which a business key function reads. The record is the
// payload [Repair] produces again.
type Kafka struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Options are more client options (TLS, SASL); the source adds the
	// seeds and the partitions it reads.
	Options []kgo.Opt
	// Topic is the consumer's topic. Required.
	Topic string
	// IDHeader is the header carrying the message ID, as the consumer's
	// idemkafka.Config.IDHeader. Defaults to idemkafka.DefaultIDHeader.
	IDHeader string
	// TimeHeader is the producers' event-time header, as the consumer's
	// idemkafka.Config.TimeHeader. Defaults to idemkafka.DefaultTimeHeader.
	TimeHeader string
	// Offsets, when set, bounds every partition by offset instead of by
	// the range's time.
	Offsets *Offsets
	// Idle bounds how long a read waits for the next record of a
	// partition not yet at its end before it fails. Defaults to 30s.
	Idle time.Duration
}

// Offsets is a range of offsets, the same for every partition: From <=
// offset < To. A To of 0 or less means the partition's end.
type Offsets struct {
	From, To int64
}

// Name implements [Source].
func (k *Kafka) Name() string { return "kafka topic " + k.Topic }

// Payloads implements [Source]: the records carry theirs.
func (k *Kafka) Payloads() bool { return true }

func (k *Kafka) idHeader() string {
	if k.IDHeader != "" {
		return k.IDHeader
	}
	return idemkafka.DefaultIDHeader
}

func (k *Kafka) timeHeader() string {
	if k.TimeHeader != "" {
		return k.TimeHeader
	}
	return idemkafka.DefaultTimeHeader
}

// bounds says, per partition, the first offset to read and the offset to
// stop before.
func (k *Kafka) bounds(ctx context.Context, cl *kgo.Client, r Range) (from, end map[int32]int64, err error) {
	adm := kadm.NewClient(cl)
	list := func(t time.Time, edge func(context.Context, ...string) (kadm.ListedOffsets, error)) (map[int32]int64, error) {
		var lo kadm.ListedOffsets
		var err error
		if t.IsZero() {
			lo, err = edge(ctx, k.Topic)
		} else {
			lo, err = adm.ListOffsetsAfterMilli(ctx, t.UnixMilli(), k.Topic)
		}
		if err != nil {
			return nil, err
		}
		if err := lo.Error(); err != nil {
			return nil, err
		}
		out := map[int32]int64{}
		for p, o := range lo[k.Topic] {
			out[p] = o.Offset
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("topic %s not found", k.Topic)
		}
		return out, nil
	}
	start, err := adm.ListStartOffsets(ctx, k.Topic)
	if err == nil {
		err = start.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile: listing the offsets of topic %s: %w", k.Topic, err)
	}
	if k.Offsets != nil {
		r = Range{} // the offsets bound the read, not the time
	}
	if from, err = list(r.From, adm.ListStartOffsets); err != nil {
		return nil, nil, fmt.Errorf("reconcile: listing the offsets of topic %s: %w", k.Topic, err)
	}
	if end, err = list(r.To, adm.ListEndOffsets); err != nil {
		return nil, nil, fmt.Errorf("reconcile: listing the offsets of topic %s: %w", k.Topic, err)
	}
	hwm, err := list(time.Time{}, adm.ListEndOffsets)
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile: listing the offsets of topic %s: %w", k.Topic, err)
	}
	for p := range end {
		if k.Offsets != nil {
			from[p], end[p] = k.Offsets.From, hwm[p]
			if k.Offsets.To > 0 {
				end[p] = k.Offsets.To
			}
		}
		if so, ok := start.Lookup(k.Topic, p); ok && from[p] < so.Offset {
			from[p] = so.Offset // the log starts later: retention deleted the rest
		}
		if end[p] > hwm[p] {
			end[p] = hwm[p]
		}
	}
	return from, end, nil
}

// Read implements [Source]: every partition from its first offset in the
// range to its last, a fetch at a time. The range ends at the partition's
// end offset when Read starts. Records are read uncommitted, as an
// idemkafka consumer reads them; transaction markers are skipped. A range
// that ends on offsets compacted away fails after Idle instead of waiting
// for ever.
func (k *Kafka) Read(ctx context.Context, r Range, page func([]Candidate) error) error {
	if len(k.Brokers) == 0 || k.Topic == "" {
		return errors.New("reconcile: Kafka needs Brokers and Topic")
	}
	meta, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, k.Options...)...)
	if err != nil {
		return fmt.Errorf("reconcile: kafka client: %w", err)
	}
	from, end, err := k.bounds(ctx, meta, r)
	meta.Close()
	if err != nil {
		return err
	}
	offsets := map[int32]kgo.Offset{}
	left := 0
	for p, o := range from {
		if o < end[p] {
			offsets[p] = kgo.NewOffset().At(o)
			left++
		}
	}
	if left == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, append(k.Options,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{k.Topic: offsets}),
		// The markers of transactions take offsets too: seen, they show a
		// partition's end.
		kgo.KeepControlRecords())...)...)
	if err != nil {
		return fmt.Errorf("reconcile: kafka client: %w", err)
	}
	defer cl.Close()
	idle := k.Idle
	if idle <= 0 {
		idle = 30 * time.Second
	}
	done := map[int32]bool{}
	for len(done) < left {
		pollCtx, cancel := context.WithTimeout(ctx, idle)
		fs := cl.PollFetches(pollCtx)
		timedOut := pollCtx.Err() != nil
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		if timedOut && fs.NumRecords() == 0 {
			var waiting []string
			for p := range offsets {
				if !done[p] {
					waiting = append(waiting, fmt.Sprintf("%d (end %d)", p, end[p]))
				}
			}
			return fmt.Errorf("reconcile: reading topic %s: no record for %s from partitions %v: their range ends on offsets no fetch returns (compacted away)", k.Topic, idle, waiting)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = errors.Join(ferr, fmt.Errorf("partition %d: %w", p, err))
			}
		})
		if ferr != nil {
			return fmt.Errorf("reconcile: reading topic %s: %w", k.Topic, ferr)
		}
		var cs []Candidate
		fs.EachRecord(func(rec *kgo.Record) {
			p := rec.Partition
			if done[p] || rec.Offset >= end[p] {
				done[p] = true
				return
			}
			if rec.Offset+1 >= end[p] {
				done[p] = true
			}
			if rec.Attrs.IsControl() {
				return
			}
			c := k.candidate(rec)
			if k.Offsets == nil && !r.Contains(rec.Timestamp) {
				return
			}
			cs = append(cs, c)
		})
		if len(cs) > 0 {
			if err := page(cs); err != nil {
				return err
			}
		}
	}
	return nil
}

// candidate is rec as the consumer receives it, with rec as the payload.
func (k *Kafka) candidate(rec *kgo.Record) Candidate {
	h := make(map[string]string, len(rec.Headers))
	for _, x := range rec.Headers {
		h[x.Key] = string(x.Value)
	}
	id := h[k.idHeader()]
	var header time.Time
	if v, ok := h[k.timeHeader()]; ok {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
			header = time.UnixMilli(ms)
		} else if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			header = t
		}
	}
	t, src := idem.EventTime(id, header, rec.Timestamp)
	payload := map[string]string{}
	for name, v := range h {
		if name != k.idHeader() && name != k.timeHeader() {
			payload[name] = v
		}
	}
	return Candidate{
		Message: idem.Message{
			ID: id, Source: rec.Topic + "/" + strconv.FormatInt(int64(rec.Partition), 10),
			Key: string(rec.Key), Headers: h, Body: rec.Value, Time: t, TimeSource: src,
		},
		Position: rec.Topic + "/" + strconv.FormatInt(int64(rec.Partition), 10) + "@" + strconv.FormatInt(rec.Offset, 10),
		Record:   &outbox.Record{ID: id, Destination: rec.Topic, Key: string(rec.Key), Headers: payload, Body: rec.Value, EventTime: t},
	}
}
