package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemstore"
	"github.com/jackc/pgx/v5"
)

// backup copies the inbox, its positions and the effects in one
// repeatable-read transaction, the snapshot pg_dump takes, while the
// consumer runs; restore puts the database back to it, as restoring that
// backup (or failing over to a replica that far behind) would.
func (d *db) backup(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{
		`CREATE TABLE backup_inbox AS SELECT * FROM idem_inbox`,
		`CREATE TABLE backup_positions AS SELECT * FROM idem_inbox_positions`,
		`CREATE TABLE backup_effects AS SELECT * FROM effects`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func (d *db) restore(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			`TRUNCATE idem_inbox, idem_inbox_positions, effects`,
			`INSERT INTO idem_inbox SELECT * FROM backup_inbox`,
			`INSERT INTO idem_inbox_positions SELECT * FROM backup_positions`,
			`INSERT INTO effects SELECT * FROM backup_effects`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// positions returns the recorded position of each partition of topic.
func (d *db) positions(t *testing.T, proc *idem.Processor[pgx.Tx], topic string) map[int32]int64 {
	t.Helper()
	ps, err := proc.Positions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	for _, p := range ps {
		var part int32
		if _, err := fmt.Sscanf(strings.TrimPrefix(p.Source, topic+"/"), "%d", &part); err == nil {
			out[part] = p.Next
		}
	}
	return out
}

// waitPositions waits until the recorded positions reach want.
func (d *db) waitPositions(t *testing.T, proc *idem.Processor[pgx.Tx], topic string, want map[int32]int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := d.positions(t, proc, topic)
		done := true
		for p, w := range want {
			if got[p] < w {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("recorded positions %v did not reach %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The restore drill: a backup taken while the consumer runs is restored
// after it consumed further, behind its back. Restarted with the group's
// committed offsets at the end of every partition, the consumer finds the
// database behind, consumes again from the database's positions, and
// applies exactly the records the restore lost, once; nothing is doubled
// and the committed offsets never move back.
func TestRewindAfterRestore(t *testing.T) {
	t.Parallel()
	const n1, n2, parts = 600, 450, 3
	k := newKafka(t)
	topic := k.topic(t, "restore", parts)
	group := k.group("restore")
	prod := k.client(t)
	d := newDB(t)
	cfg := func(obs *commits) *idemkafka.Config {
		return &idemkafka.Config{MaxBatch: 40, Positions: idemkafka.PositionsRewind, Hooks: []idem.Hook{obs}, Logger: testLogger}
	}

	outA := newOutcomes()
	procA := d.processor(t, outA, nil)
	obsA := newCommits(t, ends(n1+n2, parts))
	a, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), procA, cfg(obsA))
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, a)
	produce(t, prod, topic, parts, 0, n1, msgID)
	wait(t, obsA.reached(ends(n1, parts)), 60*time.Second, "the first records to commit")
	d.waitPositions(t, procA, topic, ends(n1, parts))
	d.backup(t) // the consumer is running
	produce(t, prod, topic, parts, n1, n2, msgID)
	wait(t, obsA.done, 60*time.Second, "every record to commit")
	if err := stopA(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rows, _ := d.effects(t); rows != n1+n2 {
		t.Fatalf("before the restore: %d effects, want %d", rows, n1+n2)
	}

	d.restore(t)
	rows, _ := d.effects(t)
	lost := n1 + n2 - rows
	if lost != n2 {
		t.Fatalf("the restore lost %d effects, want %d", lost, n2)
	}

	outB := newOutcomes()
	procB := d.processor(t, outB, nil)
	obsB := newCommits(t, ends(n1+n2, parts))
	b, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), procB, cfg(obsB))
	if err != nil {
		t.Fatal(err)
	}
	stopB := run(t, b)
	waitOr(t, outB.reached(idem.Applied, lost), 60*time.Second, "the lost records to be applied again", func() string { return consumerState(b) })
	d.waitPositions(t, procB, topic, ends(n1+n2, parts))
	if err := stopB(); err != nil {
		t.Fatalf("Run after the restore: %v", err)
	}
	if rows, distinct := d.effects(t); rows != n1+n2 || distinct != n1+n2 {
		t.Errorf("after the rewind: %d effects, %d distinct; want %d of each", rows, distinct, n1+n2)
	}
	if got := outB.get(idem.Applied); got != lost {
		t.Errorf("applied again %d, want exactly the %d lost", got, lost)
	}
	st := b.Stats()
	if st.Rewinds != parts || st.Rewound != uint64(lost) {
		t.Errorf("stats: %d partitions rewound over %d records, want %d over %d", st.Rewinds, st.Rewound, parts, lost)
	}
	if dups := outB.get(idem.Duplicate); dups != 0 {
		t.Errorf("%d duplicates: the rewind went further back than the database's positions", dups)
	}
}

// A database with no recorded position (positions off until now, or
// forgotten) is not compared: the broker's committed offsets are trusted,
// even over effects the database lost; positions are recorded from then on.
func TestNoPositionTrustsBroker(t *testing.T) {
	t.Parallel()
	const n, more, parts = 300, 60, 2
	k := newKafka(t)
	topic := k.topic(t, "trust", parts)
	group := k.group("trust")
	prod := k.client(t)
	d := newDB(t)
	produce(t, prod, topic, parts, 0, n, msgID)
	outA := newOutcomes()
	obsA := newCommits(t, ends(n, parts))
	a, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, outA, nil),
		&idemkafka.Config{MaxBatch: 40, Hooks: []idem.Hook{obsA}, Logger: testLogger})
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, a)
	wait(t, obsA.done, 60*time.Second, "every record to commit")
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.pool.Exec(ctx, `DELETE FROM effects WHERE message_id > $1`, msgID(n-50)); err != nil {
		t.Fatal(err)
	}

	out := newOutcomes()
	proc := d.processor(t, out, nil)
	if got := d.positions(t, proc, topic); len(got) != 0 {
		t.Fatalf("positions recorded with Positions off: %v", got)
	}
	total := ends(n+more, parts)
	obs := newCommits(t, total)
	b, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc,
		&idemkafka.Config{MaxBatch: 40, Positions: idemkafka.PositionsRewind, Hooks: []idem.Hook{obs}, Logger: testLogger})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, b)
	produce(t, prod, topic, parts, n, more, msgID)
	waitOr(t, obs.done, 60*time.Second, "the new records to commit", func() string { return consumerState(b) })
	d.waitPositions(t, proc, topic, total)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Rewinds != 0 || st.Refusals != 0 {
		t.Errorf("stats %+v: no position recorded, yet the consumer rewound or refused", st)
	}
	if got := out.get(idem.Applied); got != more {
		t.Errorf("applied %d, want only the %d new records", got, more)
	}
}

// In refuse mode a partition whose database position is behind the
// broker's is not consumed: the consumer is not ready, and its health
// names the partition and both offsets, while the other partitions are
// consumed. Forgetting the positions (a database deliberately reset)
// lets the partition be consumed again from the broker's offset.
func TestRefuseWhenDatabaseBehind(t *testing.T) {
	t.Parallel()
	const n, more, parts = 200, 40, 2
	k := newKafka(t)
	topic := k.topic(t, "refuse", parts)
	group := k.group("refuse")
	prod := k.client(t)
	d := newDB(t)
	produce(t, prod, topic, parts, 0, n, msgID)
	outA := newOutcomes()
	procA := d.processor(t, outA, nil)
	obsA := newCommits(t, ends(n, parts))
	a, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), procA,
		&idemkafka.Config{MaxBatch: 40, Positions: idemkafka.PositionsRewind, Hooks: []idem.Hook{obsA}, Logger: testLogger})
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, a)
	wait(t, obsA.done, 60*time.Second, "every record to commit")
	d.waitPositions(t, procA, topic, ends(n, parts))
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	// Partition 0's position goes back 30 records, as a restore would take it.
	ctx := context.Background()
	end0 := ends(n, parts)[0]
	if _, err := d.pool.Exec(ctx, `UPDATE idem_inbox_positions SET next_offset = $1 WHERE source = $2`, end0-30, topic+"/0"); err != nil {
		t.Fatal(err)
	}

	out := newOutcomes()
	proc := d.processor(t, out, nil)
	total := ends(n+more, parts)
	obs := newCommits(t, total)
	b, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), proc, &idemkafka.Config{
		MaxBatch: 40, Positions: idemkafka.PositionsRefuse, Hooks: []idem.Hook{obs}, Logger: testLogger,
		Backoff: idem.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, b)
	produce(t, prod, topic, parts, n, more, msgID)
	// Partition 1 is consumed to its end meanwhile.
	waitOr(t, obs.reached(map[int32]int64{1: total[1]}), 60*time.Second, "partition 1 to commit", func() string { return consumerState(b) })
	deadline := time.Now().Add(60 * time.Second)
	var why error
	for why = b.Health().Ready(); why == nil && time.Now().Before(deadline); why = b.Health().Ready() {
		time.Sleep(20 * time.Millisecond)
	}
	if why == nil {
		t.Fatal("the consumer refusing a partition says it is ready")
	}
	for _, want := range []string{topic + "/0", fmt.Sprint(end0 - 30), fmt.Sprint(end0)} {
		if !strings.Contains(why.Error(), want) {
			t.Errorf("health %q does not name %s", why, want)
		}
	}
	if st := b.Stats(); st.Refusals != 1 || st.Rewinds != 0 {
		t.Errorf("stats %+v: want one refusal and no rewind", st)
	}
	var p0 int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE source = $1 AND message_id >= $2`, topic+"/0", msgID(n)).Scan(&p0); err != nil {
		t.Fatal(err)
	}
	if p0 != 0 {
		t.Errorf("%d new records of the refused partition applied", p0)
	}
	if got := out.get(idem.Applied); got != int(total[1]-ends(n, parts)[1]) {
		t.Errorf("applied %d, want only partition 1's %d new records", got, total[1]-ends(n, parts)[1])
	}

	// The database was reset on purpose: forget its positions.
	if forgot, err := b.ForgetPositions(ctx); err != nil || forgot != parts {
		t.Fatalf("ForgetPositions = %d, %v; want %d", forgot, err, parts)
	}
	waitOr(t, obs.done, 60*time.Second, "the refused partition to be consumed after its positions were forgotten", func() string { return consumerState(b) })
	if err := b.Health().Ready(); err != nil {
		t.Errorf("still not ready after the positions were forgotten: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.get(idem.Applied), more; got != want {
		t.Errorf("applied %d, want the %d new records, the 30 behind the forgotten position not again", got, want)
	}
}

// In order, a batch that falls back to one message at a time records each
// message's position in its own transaction, and none past a Retry: the
// message that must be retried and those after it are not settled.
// Messages dead-lettered without a transaction at the end of a batch get
// their position in one of its own.
func TestPositionsNeverPassARetry(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	ctx := context.Background()
	const stuck, flaky = "evt-000005", "evt-000002"
	var flaked atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if m.ID == flaky && flaked.CompareAndSwap(false, true) {
			// Fails the batch's shared try, which falls back to one
			// message at a time.
			return errors.New("flaky")
		}
		if m.ID == stuck {
			// Not set up for it: an outage, held (Retry), never dead-lettered.
			_, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`)
			return err
		}
		return write(ctx, tx, m)
	}
	proc := d.processor(t, newOutcomes(), h, func(c *idem.Config[pgx.Tx]) { c.Retry.WaitUnavailable = 10 * time.Millisecond })
	batch := func(from, to int, noID ...int) []idem.Message {
		var msgs []idem.Message
		for i := from; i < to; i++ {
			m := idem.Message{ID: msgID(i), Source: "t/0", Body: []byte("x"), Next: int64(i) + 1}
			for _, j := range noID {
				if i == j {
					m.ID = ""
				}
			}
			msgs = append(msgs, m)
		}
		return msgs
	}
	pos := func() int64 {
		ps, err := proc.Positions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Source == "t/0" {
				return p.Next
			}
		}
		return 0
	}
	res := proc.ProcessBatchInOrder(ctx, batch(0, 10, 8))
	if res[5].Outcome != idem.Retry {
		t.Fatalf("the stuck message: %v (%v), want Retry", res[5].Outcome, res[5].Err)
	}
	for i := 0; i < 5; i++ {
		if res[i].Outcome != idem.Applied {
			t.Fatalf("message %d: %v (%v), want Applied", i, res[i].Outcome, res[i].Err)
		}
	}
	if got := pos(); got != 5 {
		t.Errorf("position after the fallback = %d, want 5: the messages before the Retry and none after", got)
	}
	// Out of order, nothing is recorded: a message after a Retry may settle.
	proc.ProcessBatch(ctx, batch(6, 10))
	if got := pos(); got != 5 {
		t.Errorf("position after ProcessBatch = %d, want 5", got)
	}
	// A batch that ends in bad input, dead-lettered without a transaction.
	res = proc.ProcessBatchInOrder(ctx, batch(10, 13, 12))
	if res[2].Outcome != idem.DeadLettered || !errors.Is(res[2].Err, idem.ErrNoMessageID) {
		t.Fatalf("the message without an ID: %v (%v)", res[2].Outcome, res[2].Err)
	}
	if got := pos(); got != 13 {
		t.Errorf("position after a batch ending in a dead letter = %d, want 13", got)
	}
	// A batch of duplicates alone records its position too (records
	// consumed again, after a rebalance gave them up): the position is
	// that of the last transaction, which never vouches for more than it
	// settled. Each source of a batch gets its own.
	res = proc.ProcessBatchInOrder(ctx, append(batch(0, 3), idem.Message{ID: msgID(20), Source: "t/1", Body: []byte("x"), Next: 21}))
	if res[0].Outcome != idem.Duplicate || res[3].Outcome != idem.Applied {
		t.Fatalf("outcomes %v, %v; want Duplicate, Applied", res[0].Outcome, res[3].Outcome)
	}
	ps, err := proc.Positions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []idemstore.Position{{Source: "t/0", Next: 3}, {Source: "t/1", Next: 21}}
	if len(ps) != 2 || ps[0].Source != want[0].Source || ps[0].Next != want[0].Next || ps[1].Source != want[1].Source || ps[1].Next != want[1].Next {
		t.Errorf("positions %+v, want %+v", ps, want)
	}
}

// A consumer with positions on refuses to start, naming the migration to
// run, on a database migrated before the positions table existed.
func TestPositionsNeedTheirTable(t *testing.T) {
	t.Parallel()
	k := newKafka(t)
	topic := k.topic(t, "notable", 1)
	d := newDB(t)
	if _, err := d.pool.Exec(context.Background(), `DROP TABLE idem_inbox_positions`); err != nil {
		t.Fatal(err)
	}
	c, err := idemkafka.NewConsumer(k.groupClient(t, k.group("notable"), []string{topic}), d.processor(t, newOutcomes(), nil),
		&idemkafka.Config{Positions: idemkafka.PositionsRewind, Logger: testLogger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if !errors.Is(err, idemkafka.ErrConfig) || !strings.Contains(err.Error(), "idem migrate") {
		t.Fatalf("Run = %v, want ErrConfig naming idem migrate", err)
	}
}
