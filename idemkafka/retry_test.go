package idemkafka_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/jackc/pgx/v5"
)

// appliedOrder returns the message IDs of the effects in the order they
// committed.
func (d *db) appliedOrder(t testing.TB) []string {
	t.Helper()
	rows, err := d.pool.Query(context.Background(), `SELECT message_id FROM effects ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// A record that must be retried holds the records after it in its
// partition: none is applied ahead of it, and the ones left untried behind
// it do not spend their own budget.
func TestRetryKeepsPartitionOrder(t *testing.T) {
	t.Parallel()
	const n = 6
	k := newKafka(t)
	topic := k.topic(t, "order", 1)
	group := k.group("order")
	produce(t, k.client(t), topic, 1, 0, n, msgID)
	d := newDB(t)
	if _, err := d.pool.Exec(context.Background(), `ALTER TABLE effects ADD COLUMN seq bigserial`); err != nil {
		t.Fatal(err)
	}
	// evt-1 and evt-2 fail on their first delivery, whatever the processor
	// retries inside it, and succeed on the next.
	flaky := map[string]bool{msgID(1): true, msgID(2): true}
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if flaky[m.ID] && m.Attempt == 1 {
			return fmt.Errorf("%s: downstream busy", m.ID)
		}
		return write(ctx, tx, m)
	}
	out := newOutcomes()
	hooks := newCommits(t, map[int32]int64{0: n})
	c, err := idemkafka.NewConsumer(k.groupClient(t, group, []string{topic}), d.processor(t, out, handler), &idemkafka.Config{
		// Two tries: evt-2 fails once on its own; had it been charged for
		// waiting behind evt-1, it would be dead-lettered.
		MaxAttempts:    2,
		InitialBackoff: time.Millisecond,
		MaxBackoff:     5 * time.Millisecond,
		Hooks:          hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	wait(t, hooks.done, 60*time.Second, "the partition committed to its end")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := make([]string, n)
	for i := range want {
		want[i] = msgID(i)
	}
	if got := d.appliedOrder(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("applied in order %v, want %v", got, want)
	}
	if dl, a := out.get(idem.DeadLettered), out.get(idem.Applied); dl != 0 || a != n || len(hooks.dl) != 0 {
		t.Errorf("%d dead-lettered (%d dead letters produced), %d applied; want 0 and %d applied", dl, len(hooks.dl), a, n)
	}
}
