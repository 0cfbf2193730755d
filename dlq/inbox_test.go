package dlq

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqliteinbox"
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
	in, err := NewInbox(pool, &InboxConfig{Consumer: "c", Key: idem.ByMessageID})
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

// A reason filter selects what the listing's groups say: the reason with
// the message ID, where it stands as a word, written <id>. It does not
// select a letter whose ID holds the word, and a reason as listed selects
// its group. An ID that is part of another word ("1" in "v1") is left.
func TestReasonFilterMatchesListedReason(t *testing.T) {
	t.Parallel()
	taxRate := Letter{ID: "inv-1", Consumer: "billing", Reason: "handling message inv-1: permanent: tax rate missing for region"}
	carrier := Letter{ID: "tax-2026-77", Consumer: "billing", Reason: "handling message tax-2026-77: permanent: carrier unknown"}
	short := Letter{ID: "1", Consumer: "billing", Reason: "handling message 1: schema v1 rejected 10 fields"}
	ls := Summarize("q", []Letter{taxRate, carrier, short})
	reasons := map[string]bool{}
	for _, g := range ls.Groups {
		reasons[g.Reason] = true
	}
	for _, want := range []string{"handling message <id>: permanent: tax rate missing for region", "handling message <id>: permanent: carrier unknown", "handling message <id>: schema v1 rejected 10 fields"} {
		if !reasons[want] {
			t.Errorf("no group %q in %v", want, reasons)
		}
	}
	if f := (Filter{Reason: "tax"}); f.Match(&carrier) || !f.Match(&taxRate) {
		t.Errorf("--reason tax selects carrier %v, tax rate %v; want false, true", f.Match(&carrier), f.Match(&taxRate))
	}
	if f := (Filter{Reason: "handling message <id>: permanent: tax rate"}); !f.Match(&taxRate) || f.Match(&carrier) {
		t.Errorf("the reason as listed selects tax rate %v, carrier %v; want true, false", f.Match(&taxRate), f.Match(&carrier))
	}
}

// Key specs as the command line gives them.
func TestParseKey(t *testing.T) {
	t.Parallel()
	m := idem.Message{ID: "m-1", Body: []byte(`{"customer":"c/7","period":202611,"lines":[{"sku":"a~b"}],"ok":true}`)}
	for _, c := range []struct{ spec, want, err string }{
		{"id", "m-1", ""},
		{"json:/customer", "c/7", ""},
		{"json:/period", "202611", ""},
		{"json:/lines/0/sku", "a~b", ""},
		{"json:/ok", "", "not a string or a number"},
		{"json:/missing", "", "nothing at /missing"},
		{"json:/lines/1/sku", "", "nothing at"},
		{"template:invoice:{/customer}:{/period}", "invoice:c/7:202611", ""},
		{"template:{id}@{/customer}", "m-1@c/7", ""},
	} {
		k, err := ParseKey(c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.spec, err)
		}
		got, err := k(m)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %q %v, want an error with %q", c.spec, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %q %v, want %q", c.spec, got, err, c.want)
		}
	}
	if k, _ := ParseKey("json:/customer"); k != nil {
		if _, err := k(idem.Message{ID: "x", Body: []byte(`not json`)}); err == nil {
			t.Error("a body that is not JSON gave a key")
		}
	}
	for _, bad := range []string{"", "ID", "json:customer", "template:constant", "template:{customer}", "template:{/a", "body"} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

// The consumer's time rules: an event time further ahead than MaxAhead is
// not trusted (the letter is untimed), and RefuseUntimed makes an untimed
// letter invalid, as the consumer dead-letters it.
func TestJudgeTimeRules(t *testing.T) {
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
	now := time.Now()
	lax, err := NewInbox(pool, &InboxConfig{Consumer: "c", Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	strict, err := NewInbox(pool, &InboxConfig{Consumer: "c", Key: idem.ByMessageID, RefuseUntimed: true, MaxAhead: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in   *Inbox
		l    Letter
		want Verdict
		why  string
	}{
		{lax, Letter{ID: "a", Time: now.Add(2 * time.Hour)}, Apply, "ahead"},
		{lax, Letter{ID: "a", Time: now.Add(30 * time.Minute)}, Apply, "no marker for key"},
		{strict, Letter{ID: "a"}, Invalid, "RefuseUntimed"},
		{strict, Letter{ID: "a", Time: now.Add(30 * time.Minute)}, Invalid, "RefuseUntimed"},
		{strict, Letter{ID: "a", Time: now}, Apply, "no marker"},
	} {
		j, err := c.in.Judge(ctx, &c.l)
		if err != nil {
			t.Fatal(err)
		}
		if j.Verdict != c.want || !strings.Contains(j.Why, c.why) {
			t.Errorf("%+v: %s (%s), want %s (%q)", c.l, j.Verdict, j.Why, c.want, c.why)
		}
	}
}

// The key function is required: judged by another key than the
// consumer's, a letter gets a wrong verdict and a replay retires the wrong
// marker, or none.
func TestNewInboxNeedsKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, cfg := range []*InboxConfig{nil, {Table: "idem_inbox"}} {
		if _, err := NewInbox(pool, cfg); !errors.Is(err, ErrNoKey) {
			t.Errorf("NewInbox(%+v): %v, want ErrNoKey", cfg, err)
		}
	}
}

// A letter whose inbox key the consumer's key validation refuses (blank,
// invalid UTF-8, a NUL byte) is judged invalid, as the consumer
// dead-letters it again, whatever the key function: the judge is the
// processor's own decision.
func TestJudgeRefusesBadKeys(t *testing.T) {
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
	byHeader := func(m idem.Message) (string, error) { return m.Headers["customer"], nil }
	byID, err := NewInbox(pool, &InboxConfig{Consumer: "c", Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	byCustomer, err := NewInbox(pool, &InboxConfig{Consumer: "c", Key: byHeader})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []struct {
		in *Inbox
		l  Letter
	}{
		{byID, Letter{ID: "inv-\x00-1", Time: now}},
		{byID, Letter{ID: "inv-\xff", Time: now}},
		{byID, Letter{ID: "   ", Time: now}},
		{byCustomer, Letter{ID: "inv-1", Time: now, Headers: map[string]string{"customer": "c-\x00"}}},
		{byCustomer, Letter{ID: "inv-2", Time: now, Headers: map[string]string{"customer": " "}}},
		{byCustomer, Letter{ID: "inv-3", Time: now, Headers: map[string]string{"customer": "c-\xfe"}}},
	} {
		j, err := c.in.Judge(ctx, &c.l)
		if err != nil {
			t.Errorf("letter %q (key header %q): %v, want invalid", c.l.ID, c.l.Headers["customer"], err)
			continue
		}
		if j.Verdict != Invalid || j.Outcome != idem.DeadLettered {
			t.Errorf("letter %q (key header %q): %s (%s), want invalid", c.l.ID, c.l.Headers["customer"], j.Verdict, j.Why)
		}
	}
}

// The judge can be the consumer's own processor over any store: here
// sqlinbox on SQLite, while the inbox the letters are retired from is
// given for its replays. A letter of another consumer is judged by a
// processor the inbox builds.
func TestJudgeWithTheConsumersProcessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	lite, err := sqliteinbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lite.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proc, err := idem.NewProcessor(lite, &idem.Config[*sql.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID,
		Handler: func(context.Context, *sql.Tx, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := proc.Process(ctx, idem.Message{ID: "led-1", Time: time.Now(), TimeSource: idem.TimeFromBroker}); r.Outcome != idem.Applied {
		t.Fatalf("process: %s %v", r.Outcome, r.Err)
	}
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	in, err := NewInbox(pool, &InboxConfig{Judges: []Judge{proc}, Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []struct {
		l    Letter
		want Verdict
	}{
		{Letter{ID: "led-1", Consumer: "ledger", Time: now}, Duplicate},
		{Letter{ID: "led-2", Consumer: "ledger", Time: now}, Apply},
		{Letter{ID: "led-\x00", Consumer: "ledger", Time: now}, Invalid},
		{Letter{ID: "led-1", Consumer: "billing", Time: now}, Apply},
	} {
		j, err := in.Judge(ctx, &c.l)
		if err != nil {
			t.Fatal(err)
		}
		if j.Verdict != c.want {
			t.Errorf("%s of %s: %s (%s), want %s", c.l.ID, c.l.Consumer, j.Verdict, j.Why, c.want)
		}
	}
}

// A letter naming a consumer no processor could have (a header written by
// hand) is judged unknown, and the walk goes on.
func TestJudgeUnknownConsumerName(t *testing.T) {
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
	in, err := NewInbox(pool, &InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	j, err := in.Judge(ctx, &Letter{ID: "a", Consumer: "Not A Consumer", Time: time.Now()})
	if err != nil || j.Verdict != Unknown {
		t.Fatalf("judge: %+v %v, want unknown", j, err)
	}
}

// On a partitioned inbox the judge the inbox builds is laid out as the
// table is: a message ID whose UUIDv7 time is past the window is
// expired, one whose marker exists is a duplicate, and a key that is
// not the ID, without the consumers' partition time, cannot be judged.
func TestJudgePartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: pgxinbox.Partitioned})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{Consumer: "c", Key: idem.ByMessageID,
		Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	seen := idem.NewUUIDv7(now)
	if r := proc.Process(ctx, idem.Message{ID: seen, Time: now, TimeSource: idem.TimeFromID}); r.Outcome != idem.Applied {
		t.Fatalf("process: %s %v", r.Outcome, r.Err)
	}
	byID, err := NewInbox(pool, &InboxConfig{Consumer: "c", Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	byHeader, err := NewInbox(pool, &InboxConfig{Consumer: "c", Key: func(m idem.Message) (string, error) { return m.Headers["k"], nil }})
	if err != nil {
		t.Fatal(err)
	}
	old := now.Add(-30 * 24 * time.Hour)
	for _, c := range []struct {
		in   *Inbox
		l    Letter
		want Verdict
	}{
		{byID, Letter{ID: seen, Time: now, TimeSource: idem.TimeFromID}, Duplicate},
		{byID, Letter{ID: idem.NewUUIDv7(now), Time: now, TimeSource: idem.TimeFromID}, Apply},
		{byID, Letter{ID: idem.NewUUIDv7(old), Time: old, TimeSource: idem.TimeFromID}, Expire},
		{byHeader, Letter{ID: "x", Time: now, Headers: map[string]string{"k": "inv-1"}}, Unknown},
	} {
		j, err := c.in.Judge(ctx, &c.l)
		if err != nil {
			t.Fatal(err)
		}
		if j.Verdict != c.want {
			t.Errorf("%s: %s (%s), want %s", c.l.ID, j.Verdict, j.Why, c.want)
		}
	}
}
