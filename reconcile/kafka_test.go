package reconcile_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/reconcile"
)

// TestReconcileKafkaTopic: an idemkafka consumer applies N records of a
// topic; the markers and effects of 100 random ones are deleted behind its
// back. Reconciling against the topic reports exactly those 100; a repair
// produces them again to the topic and the consumer applies each once; a
// second reconciliation (the topic now holds the copies too) reports
// nothing missing.
func TestReconcileKafkaTopic(t *testing.T) {
	t.Parallel()
	const n = 500
	ctx := context.Background()
	d := newDB(t)
	k := kafkatest.NewCluster(t)
	brokers := k.ListenAddrs()
	kafkatest.CreateTopics(t, brokers, 3, "events", "events.dlq")

	proc := d.processor(t, idem.ByMessageID)
	cons, err := idemkafka.New(idemkafka.ClientConfig{Brokers: brokers, Group: "billing", Topics: []string{"events"}, Options: kafkatest.GroupOptions()},
		proc, &idemkafka.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "consumer", cons.Run)

	prod := kafkatest.Client(t, brokers, kafkapub.ProducerOptions()...)
	pub, err := kafkapub.New(prod, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	recs := make([]outbox.Record, n)
	now := time.Now().UTC()
	for i := range recs {
		ids[i] = fmt.Sprintf("ev-%04d", i)
		recs[i] = outbox.Record{ID: ids[i], Destination: "events", Key: fmt.Sprintf("c-%d", i%7), Body: fmt.Appendf(nil, `{"n":%d}`, i), EventTime: now}
	}
	for i, err := range pub.Publish(ctx, recs) {
		if err != nil {
			t.Fatalf("producing %s: %v", ids[i], err)
		}
	}
	waitFor(t, 3*time.Minute, "the consumer to apply every record", func() bool {
		_, distinct := d.effects(t)
		return distinct == n
	})
	lost := d.lose(t, ids, 100)

	src := &reconcile.Kafka{Brokers: brokers, Topic: "events", IDHeader: idemkafka.DefaultIDHeader}
	rep, err := reconcile.Check(ctx, src, proc, reconcile.Range{From: now.Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got := missingIDs(&rep); !slices.Equal(got, lost) {
		t.Fatalf("reported %d missing, want exactly the %d lost:\ngot  %v\nwant %v", len(got), len(lost), got, lost)
	}
	if rep.Checked != n || rep.Counts[reconcile.Applied] != n-100 {
		t.Fatalf("checked %d, counts %v", rep.Checked, rep.Counts)
	}
	for _, f := range rep.Missing {
		if !strings.HasPrefix(f.Position, "events/") || f.Record == nil || string(f.Record.Body) == "" {
			t.Fatalf("finding %+v: want its position and the record", f)
		}
	}
	// An offset range reads that range only: the first ten records of
	// every partition.
	if part, err := reconcile.Check(ctx, &reconcile.Kafka{Brokers: brokers, Topic: "events", Offsets: &reconcile.Offsets{From: 0, To: 10}}, proc, reconcile.Range{}); err != nil || part.Checked != 30 {
		t.Fatalf("offsets 0-10 of 3 partitions: checked %d, %v; want 30", part.Checked, err)
	}

	repaired, err := reconcile.Repair(ctx, &rep, reconcile.RepairConfig{Publisher: pub, Destination: "events", Rate: 1000, Logger: quiet})
	if err != nil || !slices.Equal(slices.Sorted(slices.Values(repaired.Sent)), lost) {
		t.Fatalf("repair: %v, sent %d, want the %d lost", err, len(repaired.Sent), len(lost))
	}
	waitFor(t, 3*time.Minute, "the consumer to apply the redelivered records", func() bool {
		_, distinct := d.effects(t)
		return distinct == n
	})
	again, err := reconcile.Check(ctx, src, proc, reconcile.Range{})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Missing) != 0 || again.Checked != n+100 || again.Counts[reconcile.Applied] != n+100 {
		t.Fatalf("after the repair: %d missing, checked %d, counts %v; want 0 missing of %d", len(again.Missing), again.Checked, again.Counts, n+100)
	}
	if rows, distinct := d.effects(t); rows != n || distinct != n {
		t.Fatalf("effects: %d rows for %d messages, want %d once each", rows, distinct, n)
	}
}

// TestReconcileKafkaTransactionalTail: a topic whose range ends on the
// marker of a committed transaction is read to its end (the marker shows
// it), and the transaction's records are judged like any other.
func TestReconcileKafkaTransactionalTail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDB(t)
	k := kafkatest.NewCluster(t)
	brokers := k.ListenAddrs()
	kafkatest.CreateTopics(t, brokers, 1, "events")
	cl := kafkatest.Client(t, brokers, kgo.TransactionalID("reconcile-test"), kgo.DefaultProduceTopic("events"))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		rec := &kgo.Record{Value: []byte("x"), Headers: []kgo.RecordHeader{{Key: idemkafka.DefaultIDHeader, Value: fmt.Appendf(nil, "tx-%d", i)}}}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	proc := d.processor(t, idem.ByMessageID)
	rep, err := reconcile.Check(ctx, &reconcile.Kafka{Brokers: brokers, Topic: "events", Idle: 2 * time.Minute}, proc, reconcile.Range{})
	if err != nil {
		t.Fatal(err)
	}
	if got := missingIDs(&rep); rep.Checked != 3 || !slices.Equal(got, []string{"tx-0", "tx-1", "tx-2"}) {
		t.Fatalf("checked %d, missing %v: want the 3 records of the transaction", rep.Checked, got)
	}
}
