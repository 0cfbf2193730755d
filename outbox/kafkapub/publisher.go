package kafkapub

import (
	"github.com/idemkit/idem/idembroker"

	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/outbox"
)

// ErrClientUnsafe is wrapped by the error [New] returns for a client whose
// settings could lose a record the broker acknowledged, write one twice or
// out of order.
var ErrClientUnsafe = errors.New("kafka client is unsafe for the outbox relay")

// Config configures a [Publisher]. The zero value is the default.
type Config struct {
	// IDHeader is the header carrying the record's ID. Defaults to
	// idemkafka.DefaultIDHeader ("idem-message-id"); set it to the
	// consumers' idemkafka.Config.IDHeader if they read another.
	IDHeader string
	// TimeHeader is the header carrying the event time, RFC 3339 with
	// nanoseconds, UTC. Defaults to idembroker.HeaderEventTime
	// ("x-event-time"), what idemkafka consumers read by default.
	TimeHeader string
}

// Publisher produces outbox records to Kafka. It implements
// [outbox.Publisher]; it is used by one goroutine at a time.
type Publisher struct {
	cl         *kgo.Client
	idHeader   string
	timeHeader string
	maxBatch   func(topic string) int32
	maxBuffer  int64 // records one flush may hold
	maxBytes   int64 // bytes the client may buffer; 0 = no limit
}

var _ outbox.Publisher = (*Publisher)(nil)

// ProducerOptions returns the options a client given to [New] must carry:
// acks from all in-sync replicas and manual flushing (the idempotent
// producer is on unless kgo.DisableIdempotentWrite is given). Append them
// to your own options. The client should be the publisher's own: with
// manual flushing, nothing produced by another part of the program is sent
// until the publisher flushes.
func ProducerOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ManualFlushing(),
	}
}

// New returns a publisher producing with cl, or an error wrapping
// [ErrClientUnsafe] naming every setting of cl that is unsafe. cfg may be
// nil. Closing the publisher does not close cl.
func New(cl *kgo.Client, cfg *Config) (*Publisher, error) {
	if cl == nil {
		return nil, fmt.Errorf("%w: the client is nil", ErrClientUnsafe)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.IDHeader == "" {
		c.IDHeader = idemkafka.DefaultIDHeader
	}
	if c.TimeHeader == "" {
		c.TimeHeader = idembroker.HeaderEventTime
	}
	if c.IDHeader == c.TimeHeader {
		return nil, fmt.Errorf("kafkapub: IDHeader and TimeHeader are both %q", c.IDHeader)
	}
	if err := checkClient(cl); err != nil {
		return nil, err
	}
	p := &Publisher{cl: cl, idHeader: c.IDHeader, timeHeader: c.TimeHeader}
	p.maxBatch, _ = cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	p.maxBuffer, _ = cl.OptValue(kgo.MaxBufferedRecords).(int64)
	p.maxBytes, _ = cl.OptValue(kgo.MaxBufferedBytes).(int64)
	if p.maxBuffer <= 0 {
		p.maxBuffer = 10000
	}
	return p, nil
}

// checkClient refuses a client that could lose, duplicate or reorder what
// it produces for the relay.
func checkClient(cl *kgo.Client) error {
	var errs []error
	if acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		errs = append(errs, errors.New("it does not require acks from all in-sync replicas (add kgo.RequiredAcks(kgo.AllISRAcks())): a row could be marked sent for a record a broker failure then loses"))
	}
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		errs = append(errs, errors.New("idempotent writes are disabled (remove kgo.DisableIdempotentWrite): a retried batch could be written twice or behind a later one, breaking the order of its key"))
	}
	if txn, _ := cl.OptValue(kgo.TransactionalID).(string); txn != "" {
		errs = append(errs, fmt.Errorf("it is transactional (kgo.TransactionalID %q): the relay produces outside Kafka transactions; give it a client without one", txn))
	}
	if manual, _ := cl.OptValue(kgo.ManualFlushing).(bool); !manual {
		errs = append(errs, errors.New("it flushes automatically (add kgo.ManualFlushing()): a record produced while an earlier one of its partition is failing could be written ahead of it"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w (use kafkapub.ProducerOptions): %w", ErrClientUnsafe, errors.Join(errs...))
	}
	return nil
}

// Close does nothing: the client stays the caller's to close.
func (p *Publisher) Close() error { return nil }

// Publish produces recs and returns, per record, nil once all in-sync
// replicas have it, an error for which outbox.IsRefused is true when the
// record itself was refused, [outbox.ErrNotAttempted] for a record not
// produced because an earlier one of its key failed, or another error for
// an outage (or for ctx done before the record's fate was known).
func (p *Publisher) Publish(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	failed := make(map[string]bool) // keys with a failed record
	var todo []int
	for i := range recs {
		if failed[recs[i].Key] {
			errs[i] = outbox.ErrNotAttempted
			continue
		}
		if err := p.fits(&recs[i]); err != nil {
			errs[i] = outbox.Refused(err)
			failed[recs[i].Key] = true
			continue
		}
		todo = append(todo, i)
	}
	for _, round := range rounds(recs, todo) {
		for len(round) > 0 {
			// A round larger than the client may buffer is produced
			// in chunks; a key that failed in one chunk is not
			// produced in the next.
			n := min(len(round), int(p.maxBuffer))
			chunk := round[:n]
			round = round[n:]
			var send []int
			for _, i := range chunk {
				if failed[recs[i].Key] {
					errs[i] = outbox.ErrNotAttempted
					continue
				}
				send = append(send, i)
			}
			res := p.produce(ctx, recs, send)
			p.settle(ctx, recs, send, res, errs, failed)
		}
	}
	return errs
}

// rounds splits idx into produce rounds, each flushed and settled before
// the next. franz-go keeps the order of a key only within one partition,
// that is one topic: a key whose records go to several topics moves to the
// next round at each change of topic, so that its record to the second
// topic is produced only once the one to the first is known written. A
// call whose keys each keep to one topic is one round.
func rounds(recs []outbox.Record, idx []int) [][]int {
	type at struct {
		topic string
		round int
	}
	last := make(map[string]at)
	var out [][]int
	for _, i := range idx {
		r := &recs[i]
		a, ok := last[r.Key]
		if ok && a.topic != r.Destination {
			a.round++
		}
		a.topic = r.Destination
		last[r.Key] = a
		for len(out) <= a.round {
			out = append(out, nil)
		}
		out[a.round] = append(out[a.round], i)
	}
	return out
}

// result is what franz-go said of one produced record.
type result struct {
	err       error
	partition int32
	done      bool
}

// produce produces recs[idx...] in order, flushes, and waits for every
// promise or ctx. Promises that arrive after ctx ended are dropped.
func (p *Publisher) produce(ctx context.Context, recs []outbox.Record, idx []int) []result {
	res := make([]result, len(idx))
	if len(idx) == 0 {
		return res
	}
	// Records left buffered by a call that ended with ctx go first: while
	// they drain during this produce, the buffer limit could fail one
	// record of a partition and take the next.
	if p.cl.BufferedProduceRecords() > 0 {
		if err := p.cl.Flush(ctx); err != nil {
			for j := range res {
				res[j] = result{err: fmt.Errorf("flushing the records of an earlier call: %w", err), partition: -1, done: true}
			}
			return res
		}
	}
	var (
		mu      sync.Mutex
		pending = len(idx)
		all     = make(chan struct{})
		gone    bool // Publish returned: late promises write nothing
	)
	for j, i := range idx {
		p.cl.Produce(ctx, p.record(&recs[i]), func(r *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if gone {
				return
			}
			res[j] = result{err: err, partition: r.Partition, done: true}
			if pending--; pending == 0 {
				close(all)
			}
		})
	}
	flushErr := p.cl.Flush(ctx)
	select {
	case <-all:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	gone = true
	for j := range res {
		if !res[j].done {
			err := ctx.Err()
			if flushErr != nil {
				err = flushErr
			}
			res[j] = result{err: fmt.Errorf("waiting for the broker's acknowledgement: %w", err), partition: -1}
		}
	}
	return res
}

// settle turns the results of one produce into each record's fate: the
// first failure of a key is classified (refused or outage), the key's later
// failures are ErrNotAttempted (franz-go failed them with the earlier one;
// none of them was written). A broker's refusal of a batch that holds
// other failed records of the partition is decided by producing those
// records again one at a time.
func (p *Publisher) settle(ctx context.Context, recs []outbox.Record, idx []int, res []result, errs []error, failed map[string]bool) {
	type tp struct {
		topic     string
		partition int32
	}
	failedIn := make(map[tp]int) // failed records per partition
	for j, i := range idx {
		if res[j].err != nil {
			failedIn[tp{recs[i].Destination, res[j].partition}]++
		}
	}
	isolate := make(map[tp][]int) // partitions whose failed records go again, one by one
	missing := make(map[string]bool)
	for j, i := range idx {
		r := &recs[i]
		err := res[j].err
		if err == nil {
			errs[i] = nil
			continue
		}
		part := tp{r.Destination, res[j].partition}
		if ids, ok := isolate[part]; ok {
			isolate[part] = append(ids, i)
			continue
		}
		if failed[r.Key] {
			errs[i] = outbox.ErrNotAttempted
			continue
		}
		failed[r.Key] = true
		switch classify(err) {
		case refusedTopic:
			gone, ok := missing[r.Destination]
			if !ok {
				gone = p.topicMissing(ctx, r.Destination)
				missing[r.Destination] = gone
			}
			if gone {
				errs[i] = outbox.Refused(fmt.Errorf("producing %s to topic %q: the topic does not exist: %w", r.ID, r.Destination, err))
			} else {
				errs[i] = fmt.Errorf("producing %s to topic %q: %w", r.ID, r.Destination, err)
			}
		case refusedBatch:
			if failedIn[part] > 1 {
				delete(failed, r.Key)
				isolate[part] = []int{i}
				continue
			}
			errs[i] = outbox.Refused(fmt.Errorf("producing %s to topic %q: %w", r.ID, r.Destination, err))
		case refusedRecord:
			errs[i] = outbox.Refused(fmt.Errorf("producing %s to topic %q: %w", r.ID, r.Destination, err))
		default:
			errs[i] = fmt.Errorf("producing %s to topic %q: %w", r.ID, r.Destination, err)
		}
	}
	parts := make([]tp, 0, len(isolate))
	for part := range isolate {
		parts = append(parts, part)
	}
	sort.Slice(parts, func(a, b int) bool {
		return parts[a].topic < parts[b].topic || parts[a].topic == parts[b].topic && parts[a].partition < parts[b].partition
	})
	for _, part := range parts {
		p.oneByOne(ctx, recs, isolate[part], errs, failed)
	}
}

// oneByOne produces recs[idx...] one record at a time, in order, so that a
// refusal names the record at fault. A key that fails is not produced
// further; after an outage nothing more is.
func (p *Publisher) oneByOne(ctx context.Context, recs []outbox.Record, idx []int, errs []error, failed map[string]bool) {
	var outage error
	for _, i := range idx {
		r := &recs[i]
		switch {
		case failed[r.Key]:
			errs[i] = outbox.ErrNotAttempted
			continue
		case outage != nil:
			failed[r.Key] = true
			errs[i] = fmt.Errorf("producing %s to topic %q: not produced after an outage: %w", r.ID, r.Destination, outage)
			continue
		}
		res := p.produce(ctx, recs, []int{i})
		err := res[0].err
		if err == nil {
			errs[i] = nil
			continue
		}
		failed[r.Key] = true
		if classify(err) == transient {
			outage = err
			errs[i] = fmt.Errorf("producing %s to topic %q: %w", r.ID, r.Destination, err)
			continue
		}
		errs[i] = outbox.Refused(fmt.Errorf("producing %s to topic %q: %w", r.ID, r.Destination, err))
	}
}

// record builds the Kafka record of r.
func (p *Publisher) record(r *outbox.Record) *kgo.Record {
	key := []byte(r.Key)
	if key == nil {
		// A nil key would be spread over partitions; an empty one is
		// hashed like any other and keeps its order.
		key = []byte{}
	}
	value := r.Body
	if value == nil {
		value = []byte{} // a nil value is a tombstone
	}
	h := make([]kgo.RecordHeader, 0, len(r.Headers)+2)
	names := make([]string, 0, len(r.Headers))
	for k := range r.Headers {
		if k != p.idHeader && k != p.timeHeader {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		h = append(h, kgo.RecordHeader{Key: k, Value: []byte(r.Headers[k])})
	}
	h = append(h, kgo.RecordHeader{Key: p.idHeader, Value: []byte(r.ID)})
	var ts time.Time
	if !r.EventTime.IsZero() {
		ts = r.EventTime
		h = append(h, kgo.RecordHeader{Key: p.timeHeader, Value: []byte(r.EventTime.UTC().Format(time.RFC3339Nano))})
	}
	return &kgo.Record{Topic: r.Destination, Key: key, Value: value, Headers: h, Timestamp: ts}
}
