package dlq

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// The verdicts, straight from the inbox: a marker is a duplicate, a key a
// prune deleted (kept in its pruned-key summary) and a time past the
// window expire, a message without an ID is invalid, the rest applies.
func TestJudge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until) VALUES
		('c', 'k-applied', 'k-applied', '\x00', now(), now()),
		('c', 'k-pruned', 'k-pruned', '\x00', now() - interval '30 days', now() - interval '30 days')`); err != nil {
		t.Fatal(err)
	}
	if res, err := store.Prune(ctx, pgxinbox.PruneOptions{}); err != nil || res.Markers != 1 || res.Summaries != 1 {
		t.Fatalf("prune: %+v %v", res, err)
	}
	in, err := NewInbox(pool, &InboxConfig{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []struct {
		l    Letter
		want Verdict
		why  string
	}{
		{Letter{ID: "k-applied", Consumer: "c", Time: now}, Duplicate, "has a marker"},
		{Letter{ID: "k-applied", Time: now}, Duplicate, "has a marker"}, // the default consumer
		{Letter{ID: "k-applied", Consumer: "other", Time: now}, Apply, "no marker"},
		{Letter{ID: "k-pruned", Consumer: "c", Time: now}, Expire, "prune deleted"},
		{Letter{ID: "k-new", Consumer: "c", Time: now.Add(-20 * 24 * time.Hour)}, Expire, "window"},
		{Letter{ID: "k-new", Consumer: "c", Time: now.Add(-time.Hour)}, Apply, "no marker"},
		{Letter{ID: "k-new", Consumer: "c"}, Apply, "no event time"},
		{Letter{Consumer: "c", Time: now}, Invalid, "no ID"},
	} {
		j, err := in.Judge(ctx, &c.l)
		if err != nil {
			t.Fatal(err)
		}
		if j.Verdict != c.want || !strings.Contains(j.Why, c.why) {
			t.Errorf("%+v: %s (%s), want %s (%q)", c.l, j.Verdict, j.Why, c.want, c.why)
		}
	}
	var nilInbox *Inbox
	if j, _ := nilInbox.Judge(ctx, &Letter{ID: "x"}); j.Verdict != Unknown {
		t.Errorf("no inbox: %s", j.Verdict)
	}
}
