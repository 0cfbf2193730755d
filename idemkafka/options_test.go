package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// An ID extractor and an event-time header replace the defaults; a record
// whose time header does not parse is bad input and is dead-lettered, and so
// is one whose ID the extractor cannot find, with the extractor's reason and
// counted by the processor's observer.
func TestIDExtractorAndEventTime(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.topic(t, "extract", 1)
	group := k.group("extract")
	prod := k.client(t)
	at := time.Date(2026, 3, 1, 23, 59, 0, 0, time.UTC)
	recs := []*kgo.Record{
		{Topic: topic, Key: []byte("order-1"), Headers: []kgo.RecordHeader{{Key: "event-time", Value: []byte(at.Format(time.RFC3339Nano))}}},
		{Topic: topic, Key: []byte("order-2"), Headers: []kgo.RecordHeader{{Key: "event-time", Value: []byte("yesterday")}}},
		{Topic: topic, Key: []byte("order-1"), Headers: []kgo.RecordHeader{{Key: "event-time", Value: []byte(at.Format(time.RFC3339Nano))}}},
		{Topic: topic, Value: []byte("keyless")},
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	d := newDB(t)
	var mu sync.Mutex
	var seen []idem.Message
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		mu.Lock()
		seen = append(seen, m)
		mu.Unlock()
		return write(ctx, tx, m)
	}
	out := newOutcomes()
	obs := newCommits(t, map[int32]int64{0: 4})
	// The event time is months old: no horizon guard, so it is applied.
	noHorizon := func(c *idem.Config[pgx.Tx]) { c.Horizon.Window = -1 }
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, out, handler, noHorizon), &idemkafka.Config{
		ID: func(r *kgo.Record) (string, error) {
			if len(r.Key) == 0 {
				return "", errors.New("record has no key")
			}
			return string(r.Key), nil
		},
		TimeHeader: "event-time",
		Hooks:      []idem.Hook{obs},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, obs.done, 60*time.Second, "the partition committed")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0].ID != "order-1" || !seen[0].Time.Equal(at) || seen[0].Source != topic+"/0" || seen[0].Attempt != 1 {
		t.Fatalf("handler saw %+v; want order-1 once with time %v from %s/0, attempt 1", seen, at, topic)
	}
	if dup := out.get(idem.Duplicate); dup != 1 {
		t.Errorf("duplicates %d, want 1", dup)
	}
	if dl := out.get(idem.DeadLettered); dl != 2 {
		t.Errorf("observer counted %d dead-lettered, want 2 (the bad time header and the keyless record)", dl)
	}
	dls := readDLQ(t, k, topic+".dlq", 2)
	if dl := dls[0]; string(dl.Key) != "order-2" || !strings.Contains(header(dl, idembroker.HeaderReason), idemkafka.ErrBadTime.Error()) {
		t.Errorf("dead letter key %q error %q; want order-2 with %q", dl.Key, header(dl, idembroker.HeaderReason), idemkafka.ErrBadTime)
	}
	if dl, e := dls[1], header(dls[1], idembroker.HeaderReason); string(dl.Value) != "keyless" ||
		!strings.Contains(e, idem.ErrNoMessageID.Error()) || !strings.Contains(e, "record has no key") {
		t.Errorf("dead letter %q error %q; want the keyless record with %q and the extractor's error", dl.Value, e, idem.ErrNoMessageID)
	}
}

// A permanent error skips the retry budget: one try, then the dead-letter
// topic. After a graceful stop the member has left the group.
func TestPermanentErrorDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.topic(t, "permanent", 1)
	group := k.group("permanent")
	produce(t, k.client(t), topic, 1, 0, 3, func(i int) string { return []string{"ok-1", "bad", "ok-2"}[i] })
	d := newDB(t)
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if m.ID == "bad" {
			return idem.Permanent(errors.New("unknown customer"))
		}
		return write(ctx, tx, m)
	}
	hooks := &countRetries{commits: newCommits(t, map[int32]int64{0: 3})}
	seam := &idemHooks{}
	withHooks := func(c *idem.Config[pgx.Tx]) { c.Hooks = []idem.Hook{seam} }
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, nil, handler, withHooks), &idemkafka.Config{Hooks: []idem.Hook{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, hooks.done, 60*time.Second, "the partition committed")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := hooks.retries.Load(); n != 0 {
		t.Errorf("%d retries of a permanent error, want 0", n)
	}
	if rows, _ := d.effects(t); rows != 2 {
		t.Errorf("effects: %d rows, want 2", rows)
	}
	dl := readDLQ(t, k, topic+".dlq", 1)[0]
	// The handler ran in the batch, then alone: Result.Attempts says so.
	if header(dl, idemkafka.DefaultIDHeader) != "bad" || header(dl, idembroker.HeaderAttempts) != strconv.Itoa(hooks.attempts) || hooks.attempts > 2 ||
		!strings.Contains(header(dl, idembroker.HeaderReason), "unknown customer") {
		t.Errorf("dead letter headers %v; want bad, %d attempts (at most 2), the handler's error", dl.Headers, hooks.attempts)
	}
	// The processor's hooks hear of every settlement and of the dead
	// letter once it is durable.
	seam.mu.Lock()
	settles, dls := fmt.Sprint(seam.settles), fmt.Sprint(seam.dls)
	seam.mu.Unlock()
	if want := "[ack dead_letter ack]"; settles != want {
		t.Errorf("settle hook saw %s, want %s", settles, want)
	}
	if want := fmt.Sprintf("[%s.dlq <nil>]", topic); dls != want {
		t.Errorf("dead-letter hook saw %s, want %s", dls, want)
	}
	groups, err := kadm.NewClient(k.client(t)).DescribeGroups(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	if g := groups[group]; len(g.Members) != 0 {
		t.Errorf("group %s has %d members after Run returned; want it left", group, len(g.Members))
	}
}

type countRetries struct {
	*commits
	retries  atomic.Int32
	attempts int // of the last dead letter
}

func (h *countRetries) OnDeadLetter(consumer, destination string, res idem.Result, err error) {
	h.commits.OnDeadLetter(consumer, destination, res, err)
	h.mu.Lock()
	h.attempts = res.Attempts
	h.mu.Unlock()
}

func (h *countRetries) OnRetry(*kgo.Record, int, idem.Result) { h.retries.Add(1) }

// idemHooks implements the processor's settle and dead-letter hooks.
type idemHooks struct {
	mu      sync.Mutex
	settles []string
	dls     []string
}

func (h *idemHooks) OnSettle(_, _ string, d idem.Disposition, _ idem.Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.settles = append(h.settles, d.Action.String())
}

func (h *idemHooks) OnDeadLetter(_, destination string, _ idem.Result, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dls = append(h.dls, destination, fmt.Sprint(err))
}
