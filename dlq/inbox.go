package dlq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/pgxinbox"
)

// DB is what an [Inbox] needs of a pool: *pgxpool.Pool has it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// RetiredTable is the audit table of retired markers, in the inbox
// table's schema.
const RetiredTable = "idem_inbox_retired"

// InboxConfig configures an [Inbox].
type InboxConfig struct {
	// Table is the inbox table, optionally schema-qualified. Defaults to
	// "idem_inbox".
	Table string
	// Key is the consumers' key function (idem.ByMessageID when they key
	// by message ID; [ParseKey] names one in words). Required: a letter
	// judged with another key than its consumer's gets a wrong verdict,
	// and a replay retires the wrong marker or none.
	Key idem.KeyFunc
	// Consumer judges letters that name no consumer (those the broker
	// dead-lettered itself at its delivery limit). Optional.
	Consumer string
	// Now is the clock of the horizon. Defaults to time.Now.
	Now func() time.Time
	// MaxAhead is the consumers' idem.Horizon.MaxAhead: an event time
	// further ahead is not trusted, and the letter is judged untimed, as
	// the consumer takes it. Defaults to an hour, the processor's default.
	MaxAhead time.Duration
	// RefuseUntimed is the consumers' idem.Config.RefuseUntimed: a letter
	// without an event time is judged invalid, as the consumer
	// dead-letters it.
	RefuseUntimed bool
}

// Inbox judges redrives against an inbox table on PostgreSQL and retires
// markers for replays.
type Inbox struct {
	db    DB
	store *pgxinbox.Store
	table pgx.Identifier
	audit string // quoted audit table
	cfg   InboxConfig

	mu       sync.Mutex
	settings *idem.Settings
	created  bool
	actions  bool                            // the actions table exists
	summary  map[string][]idem.PrunedSummary // by consumer
}

// pruned reads, once per consumer, the summaries of the keys prunes
// deleted.
func (in *Inbox) pruned(ctx context.Context, consumer string) ([]idem.PrunedSummary, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if s, ok := in.summary[consumer]; ok {
		return s, nil
	}
	s, err := in.store.PrunedSummaries(ctx, consumer)
	if err != nil {
		return nil, err
	}
	if in.summary == nil {
		in.summary = map[string][]idem.PrunedSummary{}
	}
	in.summary[consumer] = s
	return s, nil
}

// ErrNoKey is returned by [NewInbox] without [InboxConfig.Key].
var ErrNoKey = errors.New("dlq: InboxConfig.Key is required: the consumers' key function (idem.ByMessageID when they key by message ID)")

// NewInbox returns the inbox of cfg.Table on db. cfg.Key is required.
func NewInbox(db DB, cfg *InboxConfig) (*Inbox, error) {
	var c InboxConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = "idem_inbox"
	}
	if c.Key == nil {
		return nil, ErrNoKey
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxAhead <= 0 {
		c.MaxAhead = time.Hour
	}
	st, err := pgxinbox.New(db, &pgxinbox.Config{Table: c.Table})
	if err != nil {
		return nil, err
	}
	id := pgx.Identifier(strings.Split(c.Table, "."))
	audit := pgx.Identifier{RetiredTable}
	if len(id) == 2 {
		audit = pgx.Identifier{id[0], RetiredTable}
	}
	return &Inbox{db: db, store: st, table: id, audit: audit.Sanitize(), cfg: c}, nil
}

// Table is the inbox table.
func (in *Inbox) Table() string { return in.cfg.Table }

// AuditTable is the audit table of retired markers.
func (in *Inbox) AuditTable() string { return in.audit }

// Settings reads, once, the layout and window stored with the table.
func (in *Inbox) Settings(ctx context.Context) (idem.Settings, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.settings != nil {
		return *in.settings, nil
	}
	s, err := in.store.Settings(ctx)
	if err != nil {
		return s, fmt.Errorf("reading the settings of inbox %s: %w", in.cfg.Table, err)
	}
	in.settings = &s
	return s, nil
}

// Judge says what a redrive of l would do at its consumer, in the order
// the consumer decides: no ID is invalid, a time past the horizon expires
// (before any marker is looked at, as the processor checks the horizon
// before it claims), then the key's marker, then the pruned-key
// summaries. A nil inbox judges Unknown; so does one that cannot say
// which consumer the letter is for.
func (in *Inbox) Judge(ctx context.Context, l *Letter) (Judgement, error) {
	if in == nil {
		return Judgement{Verdict: Unknown, Why: "no inbox given to judge with"}, nil
	}
	if l.ID == "" {
		return Judgement{Verdict: Invalid, Why: "the message has no ID"}, nil
	}
	lt, ahead := l.Time, false
	if !lt.IsZero() && lt.After(in.cfg.Now().Add(in.cfg.MaxAhead)) {
		// A clock gone wrong: the consumer takes the message as untimed.
		lt, ahead = time.Time{}, true
	}
	if lt.IsZero() && in.cfg.RefuseUntimed {
		return Judgement{Verdict: Invalid, Why: "the message has no event time (or one more than " + in.cfg.MaxAhead.String() + " ahead), and the consumer refuses untimed messages"}, nil
	}
	set, err := in.Settings(ctx)
	if err != nil {
		return Judgement{}, err
	}
	partitioned := set.Layout == idem.LayoutPartitioned
	if !partitioned {
		if j, ok := in.expired(set, lt, "event time", l.TimeSource.String()); ok {
			return j, nil
		}
	}
	consumer := l.Consumer
	if consumer == "" {
		consumer = in.cfg.Consumer
	}
	if consumer == "" {
		return Judgement{Verdict: Unknown, Why: "the letter names no consumer (give one)"}, nil
	}
	key, err := in.cfg.Key(l.message())
	if err != nil {
		return Judgement{Verdict: Invalid, Why: "no inbox key: " + err.Error()}, nil
	}
	if key == "" || len(key) > idem.MaxKeyLen {
		return Judgement{Verdict: Invalid, Why: fmt.Sprintf("inbox key %q is empty or longer than %d bytes", key, idem.MaxKeyLen)}, nil
	}
	j := Judgement{InboxKey: key}
	// timed: the horizon accepted the message by a time every copy of it
	// carries, so its marker, had a copy been seen, is not pruned yet.
	timed := !lt.IsZero() && l.TimeSource == idem.TimeFromID
	if partitioned {
		if pt, ok := idem.TimeFromUUIDv7(key); ok {
			if jj, ok := in.expired(set, pt, "partition time", "the key"); ok {
				jj.InboxKey = key
				return jj, nil
			}
			timed = true
		} else if jj, ok := in.expired(set, lt, "event time", l.TimeSource.String()); ok {
			jj.InboxKey = key
			return jj, nil
		}
	}
	m, err := in.lookup(ctx, consumer, key)
	if err != nil {
		return j, err
	}
	if m != nil {
		j.Verdict, j.Marker = Duplicate, m
		j.Why = fmt.Sprintf("consumer %s has a marker for key %q, written %s by message %q", consumer, key, m.ProcessedAt.UTC().Format(time.RFC3339), m.MessageID)
		return j, nil
	}
	if !timed || set.Window <= 0 {
		pruned, err := in.pruned(ctx, consumer)
		if err != nil {
			return j, err
		}
		for _, p := range pruned {
			if p.Has(key) {
				j.Verdict = Expire
				j.Why = fmt.Sprintf("key %q is probably among the markers a prune deleted on %s (a pruned-key summary holds it): a late duplicate, which a consumer with RefuseLate expires and one without applies again", key, p.Day.UTC().Format(time.DateOnly))
				return j, nil
			}
		}
	}
	j.Verdict = Apply
	j.Why = fmt.Sprintf("consumer %s has no marker for key %q", consumer, key)
	switch {
	case ahead:
		j.Why += fmt.Sprintf("; its event time %s is more than %v ahead, so the consumer takes it as untimed and the horizon cannot judge it", l.Time.UTC().Format(time.RFC3339), in.cfg.MaxAhead)
	case lt.IsZero():
		j.Why += "; the message has no event time, so the horizon cannot judge it"
	}
	return j, nil
}

// expired judges t against the horizon of the inbox's window.
func (in *Inbox) expired(set idem.Settings, t time.Time, what, from string) (Judgement, bool) {
	if set.Window <= 0 || t.IsZero() {
		return Judgement{}, false
	}
	limit := in.cfg.Now().Add(-set.Window + min(5*time.Minute, set.Window/10))
	if !t.Before(limit) {
		return Judgement{}, false
	}
	return Judgement{Verdict: Expire, Why: fmt.Sprintf("%s %s (from %s) is before %s, the horizon of the inbox's %v window: the consumer expires it before it looks at any marker", what, t.UTC().Format(time.RFC3339), from, limit.UTC().Format(time.RFC3339), set.Window)}, true
}

func (in *Inbox) lookup(ctx context.Context, consumer, key string) (*idem.Marker, error) {
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ms, err := in.store.Lookup(ctx, tx, consumer, []string{key})
	if err != nil {
		return nil, fmt.Errorf("looking up the marker of %q in %s: %w", key, in.cfg.Table, err)
	}
	if m, ok := ms[key]; ok {
		return &m, nil
	}
	return nil, nil
}

// Retired is one row of the audit table: a marker retired for a replay.
type Retired struct {
	ID          int64     `json:"id"`
	RetiredAt   time.Time `json:"retired_at"`
	RetiredBy   string    `json:"retired_by"`
	Why         string    `json:"why"`
	InboxTable  string    `json:"inbox_table"`
	Consumer    string    `json:"consumer"`
	Key         string    `json:"key"`
	MessageID   string    `json:"message_id"`
	ReplayOf    string    `json:"replay_of"`
	BodySHA256  []byte    `json:"body_sha256"`
	EventTime   time.Time `json:"event_time,omitzero"`
	ProcessedAt time.Time `json:"processed_at"`
	KeepUntil   time.Time `json:"keep_until"`
	// Restores is, on a row that put a marker back (its replay's
	// republish failed), the ID of the row that retired it; 0 on a
	// retirement.
	Restores int64 `json:"restores,omitempty"`
}

// ensureAudit creates the audit table when it does not exist.
func (in *Inbox) ensureAudit(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.created {
		return nil
	}
	_, err := in.db.Exec(ctx, auditDDL(in.audit))
	if err == nil {
		// Tables created before restorations were recorded.
		_, err = in.db.Exec(ctx, `ALTER TABLE `+in.audit+` ADD COLUMN IF NOT EXISTS restores bigint`)
	}
	if err != nil {
		var pe *pgconn.PgError
		// Two first replays at once: one of the creations loses the race
		// on the catalog; the table is there.
		if !errors.As(err, &pe) || (pe.Code != "23505" && pe.Code != "42P07") {
			return fmt.Errorf("creating the audit table %s: %w", in.audit, err)
		}
	}
	in.created = true
	return nil
}

// AuditDDL is the statement that creates the audit table of retired
// markers beside the inbox table (in its schema), for a team that applies
// its schema with a migration tool. The first replay creates it otherwise.
func AuditDDL(inboxTable string) (string, error) {
	if inboxTable == "" {
		inboxTable = "idem_inbox"
	}
	if _, err := pgxinbox.New(noDB{}, &pgxinbox.Config{Table: inboxTable}); err != nil {
		return "", err
	}
	audit := pgx.Identifier{RetiredTable}
	if schema, _, ok := strings.Cut(inboxTable, "."); ok {
		audit = pgx.Identifier{schema, RetiredTable}
	}
	return auditDDL(audit.Sanitize()) + ";\n", nil
}

// noDB lets AuditDDL validate a table name the way the store does.
type noDB struct{}

func (noDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("no database") }
func (noDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("no database")
}

// auditDDL creates the audit table: the marker's columns, plus who, when
// and why; marker keeps the whole row as it was (the partitioned layout's
// partition_time with it). Rows are only ever inserted: a marker put back
// after its replay's republish failed is a row of its own, whose restores
// names the row that retired it.
func auditDDL(audit string) string {
	return `CREATE TABLE IF NOT EXISTS ` + audit + ` (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    retired_at   timestamptz NOT NULL DEFAULT now(),
    retired_by   text NOT NULL CHECK (retired_by <> ''),
    why          text NOT NULL CHECK (why <> ''),
    inbox_table  text NOT NULL,
    consumer     text NOT NULL,
    key          text NOT NULL,
    message_id   text NOT NULL,
    replay_of    text NOT NULL,
    body_sha256  bytea NOT NULL,
    event_time   timestamptz,
    processed_at timestamptz NOT NULL,
    keep_until   timestamptz NOT NULL,
    marker       jsonb NOT NULL,
    restores     bigint
)`
}

// ErrNoMarker is returned by [Inbox.Retire] when the key has no marker.
var ErrNoMarker = errors.New("no marker to retire")

// Retire moves the marker of (consumer, key) to the audit table with who
// and why, in one transaction: the marker is gone from the inbox exactly
// when its audit row exists. replayOf is the message ID being replayed.
func (in *Inbox) Retire(ctx context.Context, key, consumer, replayOf string, r Retirement) (Retired, error) {
	if consumer == "" {
		consumer = in.cfg.Consumer
	}
	if strings.TrimSpace(r.By) == "" || strings.TrimSpace(r.Why) == "" {
		return Retired{}, errors.New("retiring a marker needs who and why")
	}
	if err := in.ensureAudit(ctx); err != nil {
		return Retired{}, err
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return Retired{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var out Retired
	var et *time.Time
	err = tx.QueryRow(ctx, `WITH gone AS (
    DELETE FROM `+in.table.Sanitize()+` WHERE consumer = $1 AND key = $2 RETURNING *
)
INSERT INTO `+in.audit+` (retired_by, why, inbox_table, consumer, key, message_id, replay_of, body_sha256, event_time, processed_at, keep_until, marker)
SELECT $3, $4, $5, g.consumer, g.key, g.message_id, $6, g.body_sha256, g.event_time, g.processed_at, g.keep_until, to_jsonb(g) FROM gone AS g
RETURNING id, retired_at, retired_by, why, inbox_table, consumer, key, message_id, replay_of, body_sha256, event_time, processed_at, keep_until`,
		consumer, key, r.By, r.Why, in.cfg.Table, replayOf).Scan(&out.ID, &out.RetiredAt, &out.RetiredBy, &out.Why, &out.InboxTable,
		&out.Consumer, &out.Key, &out.MessageID, &out.ReplayOf, &out.BodySHA256, &et, &out.ProcessedAt, &out.KeepUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return Retired{}, fmt.Errorf("%w: consumer %s, key %q in %s", ErrNoMarker, consumer, key, in.cfg.Table)
	}
	if err != nil {
		return Retired{}, fmt.Errorf("retiring the marker of %q: %w", key, err)
	}
	if et != nil {
		out.EventTime = *et
	}
	if err := tx.Commit(ctx); err != nil {
		return Retired{}, fmt.Errorf("retiring the marker of %q: %w", key, err)
	}
	return out, nil
}

// RetiredMarkers lists the audit rows of consumer (all consumers when
// empty), newest first, at most limit (0: 100).
func (in *Inbox) RetiredMarkers(ctx context.Context, consumer string, limit int) ([]Retired, error) {
	if limit <= 0 {
		limit = 100
	}
	if err := in.ensureAudit(ctx); err != nil {
		return nil, err
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `SELECT id, retired_at, retired_by, why, inbox_table, consumer, key, message_id, replay_of, body_sha256, event_time, processed_at, keep_until, coalesce(restores, 0)
FROM `+in.audit+` WHERE inbox_table = $1 AND ($2 = '' OR consumer = $2) ORDER BY id DESC LIMIT $3`, in.cfg.Table, consumer, limit)
	if err != nil {
		return nil, err
	}
	var out []Retired
	var r Retired
	var et *time.Time
	_, err = pgx.ForEachRow(rows, []any{&r.ID, &r.RetiredAt, &r.RetiredBy, &r.Why, &r.InboxTable, &r.Consumer, &r.Key, &r.MessageID, &r.ReplayOf, &r.BodySHA256, &et, &r.ProcessedAt, &r.KeepUntil, &r.Restores}, func() error {
		if et != nil {
			r.EventTime = *et
		} else {
			r.EventTime = time.Time{}
		}
		out = append(out, r)
		r.BodySHA256 = nil
		return nil
	})
	return out, err
}

// restore puts back the marker that audit row id retired, when its
// replay's republish failed, and records that in a row of its own, in one
// transaction. A marker written since (the republish went through after
// all, and the consumer applied it) is kept, and nothing is recorded:
// restored is false.
func (in *Inbox) restore(ctx context.Context, id int64, r Retirement, cause string) (out Retired, restored bool, err error) {
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return Retired{}, false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var et *time.Time
	err = tx.QueryRow(ctx, `WITH src AS (
    SELECT * FROM `+in.audit+` WHERE id = $1 AND restores IS NULL
), back AS (
    INSERT INTO `+in.table.Sanitize()+` SELECT (jsonb_populate_record(NULL::`+in.table.Sanitize()+`, src.marker)).* FROM src
    ON CONFLICT DO NOTHING RETURNING consumer, key
)
INSERT INTO `+in.audit+` (retired_by, why, inbox_table, consumer, key, message_id, replay_of, body_sha256, event_time, processed_at, keep_until, marker, restores)
SELECT $2, $3, s.inbox_table, s.consumer, s.key, s.message_id, s.replay_of, s.body_sha256, s.event_time, s.processed_at, s.keep_until, s.marker, s.id
FROM src AS s JOIN back AS b ON b.consumer = s.consumer AND b.key = s.key
RETURNING id, retired_at, retired_by, why, inbox_table, consumer, key, message_id, replay_of, body_sha256, event_time, processed_at, keep_until, restores`,
		id, r.By, "restored: "+cause).Scan(&out.ID, &out.RetiredAt, &out.RetiredBy, &out.Why, &out.InboxTable,
		&out.Consumer, &out.Key, &out.MessageID, &out.ReplayOf, &out.BodySHA256, &et, &out.ProcessedAt, &out.KeepUntil, &out.Restores)
	if errors.Is(err, pgx.ErrNoRows) {
		return Retired{}, false, nil
	}
	if err != nil {
		return Retired{}, false, fmt.Errorf("restoring the marker of audit row %d: %w", id, err)
	}
	if et != nil {
		out.EventTime = *et
	}
	if err := tx.Commit(ctx); err != nil {
		return Retired{}, false, fmt.Errorf("restoring the marker of audit row %d: %w", id, err)
	}
	return out, true, nil
}

// replayedBefore returns the audit row of a replay of message replayOf
// that retired a marker of (consumer, key) before the marker m was
// written: m is then, all but surely, that replay's own effect, and the
// letter a copy left in the DLQ. Reading creates nothing.
func (in *Inbox) replayedBefore(ctx context.Context, consumer, key, replayOf string, m *idem.Marker) (*Retired, error) {
	if m == nil {
		return nil, nil
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, in.audit).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	_ = tx.Rollback(ctx)
	if err := in.ensureAudit(ctx); err != nil {
		return nil, err
	}
	if tx, err = in.db.Begin(ctx); err != nil {
		return nil, err
	}
	var r Retired
	err = tx.QueryRow(ctx, `SELECT id, retired_at, retired_by, why FROM `+in.audit+`
WHERE inbox_table = $1 AND consumer = $2 AND key = $3 AND replay_of = $4 AND restores IS NULL
  AND retired_at <= $5
  AND NOT EXISTS (SELECT 1 FROM `+in.audit+` AS b WHERE b.restores = `+in.audit+`.id)
ORDER BY id DESC LIMIT 1`, in.cfg.Table, consumer, key, replayOf, m.ProcessedAt).Scan(&r.ID, &r.RetiredAt, &r.RetiredBy, &r.Why)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the audit table %s: %w", in.audit, err)
	}
	return &r, nil
}
