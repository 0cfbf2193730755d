package idemkafka_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// uuidv7 returns a UUIDv7 whose time is at (random bits fixed by seq).
func uuidv7(at time.Time, seq uint16) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[0:8], uint64(at.UnixMilli())<<16)
	b[6] = 0x70 | byte(seq>>8)&0x0f
	b[7] = byte(seq)
	b[8] = 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// The event time comes from the most stable source a record has (the
// UUIDv7 ID, then the x-event-time header, then the record timestamp), and
// the source is recorded; the same ID produced again with another record
// timestamp is still a duplicate.
func TestEventTimeSources(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.topic(t, "evtime", 1)
	prod := k.client(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	idTime, hdrTime, ts1, ts2 := now.Add(-3*time.Hour), now.Add(-2*time.Hour), now.Add(-time.Hour), now.Add(-time.Minute)
	v7 := uuidv7(idTime, 1)
	rec := func(id string, ts time.Time, hdr string) *kgo.Record {
		r := idemkafka.NewRecord(topic, id, nil, []byte(id))
		r.Timestamp = ts
		if hdr != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: idemkafka.DefaultTimeHeader, Value: []byte(hdr)})
		}
		return r
	}
	recs := []*kgo.Record{
		rec(v7, ts1, hdrTime.Format(time.RFC3339Nano)),                  // the ID's time wins
		rec("plain-1", ts1, strconv.FormatInt(hdrTime.UnixMilli(), 10)), // then the header
		rec("plain-2", ts1, ""),                                         // then the record timestamp
		rec("plain-2", ts2, ""),                                         // republished with a fresh timestamp
		rec(v7, ts2, ""),                                                // and the UUIDv7 one too
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	d := newDB(t)
	var mu sync.Mutex
	seen := map[string]idem.Message{}
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		mu.Lock()
		seen[m.ID] = m
		mu.Unlock()
		return write(ctx, tx, m)
	}
	out := newOutcomes()
	obs := newCommits(t, map[int32]int64{0: int64(len(recs))})
	c, err := idemkafka.NewConsumer(k.groupClient(t, k.group("evtime"), []string{topic}), d.processor(t, out, handler), &idemkafka.Config{Hooks: []idem.Hook{obs}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, obs.done, 30*time.Second, "the partition committed")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		at  time.Time
		src idem.TimeSource
	}{
		v7:        {idTime, idem.TimeFromID},
		"plain-1": {hdrTime, idem.TimeFromHeader},
		"plain-2": {ts1, idem.TimeFromBroker},
	}
	for id, w := range want {
		m, ok := seen[id]
		if !ok {
			t.Errorf("%s was not applied", id)
			continue
		}
		if !m.Time.Equal(w.at) || m.TimeSource != w.src {
			t.Errorf("%s: time %v from %v, want %v from %v", id, m.Time, m.TimeSource, w.at, w.src)
		}
	}
	if a, dup := out.get(idem.Applied), out.get(idem.Duplicate); a != 3 || dup != 2 {
		t.Errorf("applied %d, duplicates %d; want 3 and 2 (the republished copies)", a, dup)
	}
	if rows, _ := d.effects(t); rows != 3 {
		t.Errorf("effects: %d rows, want 3", rows)
	}
}
