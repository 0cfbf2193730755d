package clusterfault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/kafkatest"
	"github.com/idemkit/idem/pgxinbox"
)

// TestPostgresFailover kills the primary of a streaming pair mid-stream
// (kill -9 of the postmaster and every backend, as when its machine dies)
// and promotes the standby, under a Kafka consumer (kfake; an offset commit
// is the ack, sent only after the database commit) whose effect is a ledger
// row written in the claim's transaction. The consumer reaches the database
// by a multi-host URL with target_session_attrs=read-write and carries on
// against the promoted node by itself. At the end: acked messages
// (committed offsets) without a ledger row on the new primary are lost;
// messages with two rows are doubled.
//
// To put the standby behind at the moment of the kill, the primary's
// walsender is stopped (SIGSTOP) shortly before it: the WAL of the commits
// made meanwhile never leaves the primary, which is what a standby lagging
// on a slow link or disk meets when the primary dies. Asynchronously, the
// primary acknowledges those commits and the consumer acks their messages:
// they are lost, and the test insists the hazard shows. Synchronously, the
// same commits wait for the standby and are never acknowledged: when the
// primary dies they have committed on it alone (the outcome unknown to the
// consumer), are redelivered, and are applied once on the new primary —
// nothing lost, nothing doubled.
//
// make test runs the synchronous case with few messages; IDEM_CLUSTER=1
// runs both with more.
func TestPostgresFailover(t *testing.T) {
	if !Full() {
		t.Run("sync smoke", func(t *testing.T) { pgFailover(t, "sync", true, 1000) })
		return
	}
	for _, mode := range []string{"async", "sync"} {
		t.Run(mode+" behind", func(t *testing.T) { pgFailover(t, mode, true, 4000) })
		// Without the walsender stopped: the standby is as close behind
		// as a local link keeps it, and the race decides.
		t.Run(mode+" streaming", func(t *testing.T) { pgFailover(t, mode, false, 4000) })
	}
}

const (
	pgPartitions = 4
	// pgLagAcks is how many messages the asynchronous case acks with the
	// walsender stopped before it kills the primary.
	pgLagAcks = 100
)

// pgFailover runs the failover in mode (async or sync) over n messages;
// behind stops the walsender before the kill.
func pgFailover(t *testing.T, mode string, behind bool, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pg := startPostgres(t, mode)
	schema := "failover_" + mode
	pool, store := pgInbox(t, ctx, schema, "")
	// No unique index on message_id: the inbox is the only guard, so a
	// message applied twice shows as two rows.
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (message_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	waitReplayed(t)
	// The durability check warns of exactly the hazard this test shows:
	// asynchronous standbys, and none with a synchronous one.
	d, err := store.Durability(ctx)
	if err != nil {
		t.Fatal(err)
	}
	warned := len(d.Risks) == 1 && strings.Contains(d.Risks[0].What, "replicate asynchronously")
	if (mode == "async") != warned || (mode == "sync" && len(d.Risks) != 0) {
		t.Fatalf("durability on the %s pair: risks %v (%s)", mode, d.Risks, d.Summary())
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (message_id) VALUES ($1)`, m.ID)
		return err
	}

	// A processor whose pool reaches the standby alone, as one configured
	// with a standby's address or without target_session_attrs: the hot
	// standby refuses the claim with 25006, which must be an outage (held,
	// no attempt spent, even with a budget of one), and the same processor
	// must work once that node is promoted, with no operator action.
	strayPool, err := pgxpool.New(ctx, pgURL(pgReplicaAddr, schema, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer strayPool.Close()
	strayStore, err := pgxinbox.New(strayPool, nil)
	if err != nil {
		t.Fatal(err)
	}
	stray, err := idem.NewProcessor(strayStore, &idem.Config[pgx.Tx]{
		Consumer: "ledger-stray", Key: idem.ByMessageID, Handler: handler, Logger: quiet,
		Retry: idem.RetryPolicy{MaxAttempts: 1, WaitUnavailable: 300 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	strayMsg := idem.Message{ID: "stray-1", Body: []byte("stray"), Time: time.Now()}
	res := stray.Process(ctx, strayMsg)
	var pgErr *pgconn.PgError
	if res.Outcome != idem.Retry || !res.Blameless || !errors.Is(res.Err, idem.ErrUnavailable) || !errors.As(res.Err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("claim on the hot standby: outcome %v blameless %v err %v; want a blameless Retry wrapping ErrUnavailable and SQLSTATE 25006", res.Outcome, res.Blameless, res.Err)
	}

	kc := kafkatest.NewCluster(t, kfake.SeedTopics(pgPartitions, "ledger", "ledger.dlq"))
	producer, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		id := pgMsgID(i)
		recs[i] = idemkafka.NewRecord("ledger", id, []byte(id), []byte(`{"id":"`+id+`"}`))
		recs[i].Partition = int32(i % pgPartitions)
	}
	// The fault comes a third of the way in. With the standby put behind,
	// the rest is produced only once the walsender is stopped, so that
	// every commit after the fault meets it however fast the consumer ran
	// through the first third; streaming, everything is there at once and
	// the kill lands mid-stream.
	third := n / 3
	produce := func(recs []*kgo.Record) {
		t.Helper()
		if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("producing %d records: %v", len(recs), err)
		}
	}
	if behind {
		produce(recs[:third])
	} else {
		produce(recs)
	}

	acks := newPGAcks()
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, Handler: handler, Logger: quiet,
		Hooks: []idem.Hook{acks},
		// The failover takes seconds; an outage is never the messages'
		// fault, whatever it lasts.
		Retry: idem.RetryPolicy{WaitUnavailable: 2 * time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(append(idemkafka.GroupOptions("ledger", "ledger"),
		kgo.SeedBrokers(kc.ListenAddrs()...)), kafkatest.GroupOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	consumer, err := idemkafka.NewConsumer(cl, proc, &idemkafka.Config{MaxBatch: 10, Hooks: []idem.Hook{acks}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()

	primary, err := pgx.Connect(ctx, pgURL(pgPrimaryAddr, schema, ""))
	if err != nil {
		t.Fatal(err)
	}
	acks.await(t, ctx, third, "the first third")
	pausedAt := acks.total()
	var waiting int
	if behind {
		pg.run("pause-wal")
		pausedAt = acks.total()
		produce(recs[third:])
	}
	switch {
	case !behind:
	case mode == "async":
		// The primary goes on acknowledging commits the standby never gets.
		acks.await(t, ctx, pausedAt+pgLagAcks, "acks with the walsender stopped")
	default:
		// Commits now wait for the standby: kill the primary under them.
		if waiting, err = awaitSyncWaiters(ctx, primary, acks); err != nil {
			t.Fatal(err)
		}
	}
	if !behind {
		// Sampled for the note only.
		if waiting, err = syncWaiters(ctx, primary); err != nil {
			t.Fatal(err)
		}
	}
	_ = primary.Close(context.Background())
	pg.run("kill-primary")
	killedAt, ackedAtKill := time.Now(), acks.total()
	ackedUnreplicated := ackedAtKill - pausedAt
	pg.run("promote")
	t.Logf("primary killed at %d acks (%d since the fault began, %d commits waiting for the standby); standby promoted in %v",
		ackedAtKill, ackedUnreplicated, waiting, time.Since(killedAt).Round(time.Millisecond))
	resumed := acks.awaitAfter(t, ctx, ackedAtKill, "the first ack after the kill")
	t.Logf("first ack after the kill: %v later", resumed.Sub(killedAt).Round(time.Millisecond))
	acks.await(t, ctx, n, "every message after the failover")
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("consumer: %v", err)
		}
	case <-time.After(pgStall):
		t.Fatalf("the consumer did not return within %v of its context's end", pgStall)
	}

	// The stray processor works against the promoted node as it is.
	if res := stray.Process(ctx, strayMsg); res.Outcome != idem.Applied {
		t.Fatalf("stray processor after the promotion: outcome %v err %v; want Applied", res.Outcome, res.Err)
	}

	// Count on the new primary: the broker's committed offsets against the
	// ledger.
	adm := kadm.NewClient(producer)
	offsets, err := adm.FetchOffsets(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := adm.ListEndOffsets(ctx, "ledger.dlq")
	if err != nil {
		t.Fatal(err)
	}
	var deadLetters int64
	dlq.Each(func(o kadm.ListedOffset) { deadLetters += o.Offset })
	newPrimary, err := pgx.Connect(ctx, pgURL(pgReplicaAddr, schema, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer newPrimary.Close(ctx)
	effects := map[string]int{}
	rows, err := newPrimary.Query(ctx, `SELECT message_id, count(*) FROM ledger WHERE message_id LIKE 'evt-%' GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var c int
	if _, err := pgx.ForEachRow(rows, []any{&id, &c}, func() error { effects[id] = c; return nil }); err != nil {
		t.Fatal(err)
	}
	f := Figure{Scenario: "postgres/" + mode + ": primary killed, replica promoted", Messages: n, Kills: 1}
	if behind {
		f.Scenario += ", standby behind"
	} else {
		f.Scenario += ", standby streaming"
	}
	for i := 0; i < n; i++ {
		p := int32(i % pgPartitions)
		o, ok := offsets.Lookup("ledger", p)
		acked := ok && o.Err == nil && int64(i/pgPartitions) < o.At
		if acked {
			f.Acked++
		}
		switch e := effects[pgMsgID(i)]; {
		case acked && e == 0:
			f.Lost++
		case e > 1:
			f.Doubled++
		}
	}
	unknown := acks.unknownCommits()
	switch {
	case !behind:
		f.Note = fmt.Sprintf("%d commits waiting for the standby just before the kill; %d messages' commits of unknown outcome", waiting, unknown)
	case mode == "async":
		f.Note = fmt.Sprintf("walsender stopped; %d messages acked between that and the kill; %d messages' commits of unknown outcome", ackedUnreplicated, unknown)
	default:
		f.Note = fmt.Sprintf("walsender stopped: %d commits waiting for the standby at the kill, committed on the old primary only; %d messages' commits of unknown outcome, not acked until the new primary had them", waiting, unknown)
	}
	f.Note += fmt.Sprintf("; first ack %v after the kill", resumed.Sub(killedAt).Round(100*time.Millisecond))
	Record(t, f)

	st := consumer.Stats()
	if deadLetters != 0 || st.DeadLettered != 0 {
		t.Errorf("%d dead letters (%d counted): healthy messages dead-lettered across the failover", deadLetters, st.DeadLettered)
	}
	if f.Acked != n {
		t.Errorf("acked %d of %d", f.Acked, n)
	}
	if f.Doubled != 0 {
		t.Errorf("%d messages doubled", f.Doubled)
	}
	switch {
	case mode == "async" && behind:
		if f.Lost == 0 {
			t.Errorf("no message lost with asynchronous replication and %d commits acked that the standby never received: the fault did not put the standby behind", ackedUnreplicated)
		}
	case mode == "sync":
		if f.Lost != 0 {
			t.Errorf("%d acked messages lost with synchronous replication", f.Lost)
		}
		if behind && unknown == 0 {
			t.Errorf("no commit of unknown outcome: the kill met no commit waiting for the standby, so the case proved nothing about them")
		}
	}
}

func pgMsgID(i int) string { return fmt.Sprintf("evt-%06d", i) }

// pgAcks follows the consumer's accepted offset commits (the acks) and the
// processor's commits of unknown outcome.
type pgAcks struct {
	mu        sync.Mutex
	committed map[int32]int64
	sum       int
	last      time.Time
	unknown   int
	changed   chan struct{} // closed and replaced at every accepted commit
}

func newPGAcks() *pgAcks {
	return &pgAcks{committed: map[int32]int64{}, changed: make(chan struct{})}
}

// OnCommit is idemkafka.CommitHook.
func (a *pgAcks) OnCommit(_ string, partition int32, offset int64, err error) {
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if offset > a.committed[partition] {
		a.sum += int(offset - a.committed[partition])
		a.committed[partition] = offset
		a.last = time.Now()
		close(a.changed)
		a.changed = make(chan struct{})
	}
}

// OnAttempt is idem.AttemptHook.
func (a *pgAcks) OnAttempt(_ string, at idem.Attempt) {
	if errors.Is(at.Err, idem.ErrCommitUnknown) {
		a.mu.Lock()
		a.unknown += len(at.MessageIDs)
		a.mu.Unlock()
	}
}

func (a *pgAcks) total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sum
}

func (a *pgAcks) unknownCommits() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unknown
}

// pgStall bounds every wait of the failover cases for progress: the
// failover itself takes seconds, so a minute without the next ack (or
// without the awaited state) is a consumer or a cluster that stopped, and
// the case fails saying where it stood instead of running into the test's
// deadline.
const pgStall = time.Minute

// await waits until at least n messages are acked; what names the wait
// in a failure.
func (a *pgAcks) await(t testing.TB, ctx context.Context, n int, what string) {
	t.Helper()
	a.awaitAfter(t, ctx, n-1, what)
}

// awaitAfter waits until more than n messages are acked and returns when
// the last ack came. It fails once no ack has come for pgStall.
func (a *pgAcks) awaitAfter(t testing.TB, ctx context.Context, n int, what string) time.Time {
	t.Helper()
	stall := time.NewTimer(pgStall)
	defer stall.Stop()
	for {
		a.mu.Lock()
		sum, last, changed, unknown := a.sum, a.last, a.changed, a.unknown
		a.mu.Unlock()
		if sum > n {
			return last
		}
		select {
		case <-changed:
			stall.Reset(pgStall)
		case <-stall.C:
			t.Fatalf("waiting for %s (more than %d acks): no ack for %v; %d acked, %d messages' commits of unknown outcome", what, n, pgStall, sum, unknown)
		case <-ctx.Done():
			t.Fatalf("waiting for %s (more than %d acks): %v; %d acked, %d messages' commits of unknown outcome", what, n, ctx.Err(), sum, unknown)
		}
	}
}

// awaitSyncWaiters waits, once the walsender is stopped, until every
// partition's batch waits in COMMIT for the standby, or a second after the
// first does (a partition may have run out of records), and returns how
// many wait. It fails if no commit waits within pgStall.
func awaitSyncWaiters(ctx context.Context, primary *pgx.Conn, acks *pgAcks) (int, error) {
	start := time.Now()
	var first time.Time
	for {
		waiting, err := syncWaiters(ctx, primary)
		if err != nil {
			return 0, err
		}
		if waiting > 0 && first.IsZero() {
			first = time.Now()
		}
		if waiting >= pgPartitions || (!first.IsZero() && time.Since(first) >= time.Second) {
			return waiting, nil
		}
		if first.IsZero() && time.Since(start) > pgStall {
			return 0, fmt.Errorf("no commit was waiting for the standby %v after the walsender stopped: %d acked, %d messages' commits of unknown outcome", pgStall, acks.total(), acks.unknownCommits())
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for commits to wait for the standby: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
