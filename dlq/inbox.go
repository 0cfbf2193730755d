package dlq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
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
	// Judges are the consumers' own processors (an *idem.Processor over
	// any store has the methods of [Judge]): a letter of consumer c is
	// judged by the one whose Consumer is c, so a redrive predicts exactly
	// what that consumer does. A letter of a consumer without one is
	// judged by a processor the inbox builds over Table from the fields
	// below, which must then say what the consumer's Config says.
	Judges []Judge
	// Key is the consumers' key function (idem.ByMessageID when they key
	// by message ID; [ParseKey] names one in words). Required without
	// Judges: a letter judged with another key than its consumer's gets a
	// wrong verdict, and a replay retires the wrong marker or none.
	Key idem.KeyFunc
	// Consumer judges letters that name no consumer (those the broker
	// dead-lettered itself at its delivery limit). Optional.
	Consumer string
	// Now is the clock of the horizon. Defaults to time.Now.
	Now func() time.Time
	// MaxAhead is the consumers' idem.Horizon.MaxAhead. Defaults to the
	// processor's default.
	MaxAhead time.Duration
	// PartitionTime is the consumers' idem.Config.PartitionTime, for a
	// partitioned inbox whose consumers do not key by message ID.
	PartitionTime func(key string) (time.Time, error)
	// RefuseUntimed is the consumers' idem.Config.RefuseUntimed.
	RefuseUntimed bool
	// RefuseLate is the consumers' idem.Config.RefuseLate. Either way a
	// letter whose key a prune probably deleted is judged [Expire] (a
	// late duplicate): without RefuseLate the consumer would apply it
	// again, so a redrive sends it only when told to.
	RefuseLate bool
}

// Judge is what an [Inbox] judges a letter with: a consumer's processor
// (*idem.Processor has these methods), which predicts what a delivery
// would do without running its handler.
type Judge interface {
	// Consumer names the consumer.
	Consumer() string
	// Predict is idem.Processor.Predict.
	Predict(ctx context.Context, msg idem.Message) (idem.Result, error)
	// Refresh is idem.Processor.Refresh: the stored settings and
	// pruned-key summaries are read again now.
	Refresh(ctx context.Context) error
}

// Inbox judges redrives with the consumers' processors and retires
// markers for replays on PostgreSQL.
type Inbox struct {
	db    DB
	store *pgxinbox.Store
	table pgx.Identifier
	audit string // quoted audit table
	cfg   InboxConfig

	mu      sync.Mutex
	created bool
	actions bool             // the actions table exists
	judges  map[string]Judge // by consumer
	// judgeStore is the store of the judges the inbox builds, laid out as
	// the table is.
	judgeStore *pgxinbox.Store
}

// ErrNoKey is returned by [NewInbox] without [InboxConfig.Key] or
// [InboxConfig.Judges].
var ErrNoKey = errors.New("dlq: InboxConfig.Key is required: the consumers' key function (idem.ByMessageID when they key by message ID)")

// NewInbox returns the inbox of cfg.Table on db. cfg.Key or cfg.Judges is
// required.
func NewInbox(db DB, cfg *InboxConfig) (*Inbox, error) {
	var c InboxConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = "idem_inbox"
	}
	if c.Key == nil && len(c.Judges) == 0 {
		return nil, ErrNoKey
	}
	if c.Now == nil {
		c.Now = time.Now
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
	in := &Inbox{db: db, store: st, table: id, audit: audit.Sanitize(), cfg: c, judges: map[string]Judge{}}
	for _, j := range c.Judges {
		in.judges[j.Consumer()] = j
	}
	return in, nil
}

// Table is the inbox table.
func (in *Inbox) Table() string { return in.cfg.Table }

// AuditTable is the audit table of retired markers.
func (in *Inbox) AuditTable() string { return in.audit }

// Settings reads the layout and window stored with the table.
func (in *Inbox) Settings(ctx context.Context) (idemstore.Settings, error) {
	s, err := in.store.Settings(ctx)
	if err != nil {
		return s, fmt.Errorf("reading the settings of inbox %s: %w", in.cfg.Table, err)
	}
	return s, nil
}

// judge returns the judge of consumer: its own processor when given one,
// else one built over the inbox table from the configuration.
func (in *Inbox) judge(ctx context.Context, consumer string) (Judge, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if j, ok := in.judges[consumer]; ok {
		return j, nil
	}
	if in.cfg.Key == nil {
		return nil, fmt.Errorf("no judge for consumer %s (InboxConfig.Judges) and no key function to build one with", consumer)
	}
	if in.judgeStore == nil {
		// The processor checks its store's layout against the table's.
		set, err := in.Settings(ctx)
		if err != nil {
			return nil, err
		}
		st := in.store
		if set.Layout == idemstore.LayoutPartitioned {
			if st, err = pgxinbox.New(in.db, &pgxinbox.Config{Table: in.cfg.Table, Layout: pgxinbox.Partitioned}); err != nil {
				return nil, err
			}
		}
		in.judgeStore = st
	}
	p, err := idem.NewProcessor(in.judgeStore, &idem.Config[pgx.Tx]{
		Consumer:      consumer,
		Key:           in.cfg.Key,
		PartitionTime: in.cfg.PartitionTime,
		Handler:       func(context.Context, pgx.Tx, idem.Message) error { return errors.New("dlq: a judge runs no handler") },
		RefuseUntimed: in.cfg.RefuseUntimed,
		RefuseLate:    in.cfg.RefuseLate,
		Horizon:       idem.Horizon{MaxAhead: in.cfg.MaxAhead, Now: in.cfg.Now},
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, fmt.Errorf("building the judge of consumer %s: %w", consumer, err)
	}
	in.judges[consumer] = p
	return p, nil
}

// Judge says what a redrive of l would do at its consumer: the consumer's
// processor predicts it (idem.Processor.Predict), on the stored settings
// and pruned-key summaries read again now, so that a judgment shown by a
// long-running console is never older than the prune before it. A nil
// inbox judges Unknown; so does one that cannot say which consumer the
// letter is for.
func (in *Inbox) Judge(ctx context.Context, l *Letter) (Judgement, error) {
	return in.judgeLetter(ctx, l, true)
}

// judgeLetter is Judge; fresh reads the consumer's settings and summaries
// again first.
func (in *Inbox) judgeLetter(ctx context.Context, l *Letter, fresh bool) (Judgement, error) {
	if in == nil {
		return Judgement{Verdict: Unknown, Why: "no inbox given to judge with"}, nil
	}
	consumer := l.Consumer
	if consumer == "" {
		consumer = in.cfg.Consumer
	}
	unnamed := consumer == ""
	if unnamed {
		if in.cfg.Key == nil {
			return Judgement{Verdict: Unknown, Why: "the letter names no consumer (give one)"}, nil
		}
		// The rules before the marker (the ID, the horizon, the key) are
		// the same for every consumer of the inbox; which marker it meets
		// depends on the consumer.
		consumer = noConsumer
	}
	p, err := in.judge(ctx, consumer)
	if errors.Is(err, idem.ErrConfig) {
		// A consumer name no processor takes (a header written by hand):
		// no consumer of it exists to predict.
		return Judgement{Verdict: Unknown, Why: err.Error()}, nil
	}
	if err != nil {
		return Judgement{}, err
	}
	if fresh {
		if err := p.Refresh(ctx); err != nil {
			return Judgement{}, fmt.Errorf("reading the settings of consumer %s: %w", consumer, err)
		}
	}
	r, err := p.Predict(ctx, l.message())
	if err != nil {
		return Judgement{InboxKey: r.Key}, fmt.Errorf("judging message %q of consumer %s: %w", l.ID, consumer, err)
	}
	if unnamed {
		switch r.Outcome {
		case idem.Applied, idem.Duplicate:
			return Judgement{Verdict: Unknown, InboxKey: r.Key, Why: "the letter names no consumer (give one)"}, nil
		}
		consumer = "of this inbox"
	}
	return judgement(consumer, l, r), nil
}

// noConsumer judges the letters that name no consumer; what its lookups
// find is not used.
const noConsumer = "idem-dlq-unnamed-consumer"

// judgement puts the processor's prediction r for l in an operator's
// words. The verdict is the outcome, but for a key a prune probably
// deleted, which the consumer expires (RefuseLate) or applies a second
// time: Expire either way, so that it is sent only on purpose.
func judgement(consumer string, l *Letter, r idem.Result) Judgement {
	j := Judgement{InboxKey: r.Key, Outcome: r.Outcome, Marker: r.First}
	if !r.PrunedOn.IsZero() {
		j.PrunedOn = r.PrunedOn
	}
	switch r.Outcome {
	case idem.Duplicate:
		j.Verdict = Duplicate
		if m := r.First; m != nil {
			j.Why = fmt.Sprintf("consumer %s has a marker for key %q, written %s by message %q", consumer, r.Key, m.ProcessedAt.UTC().Format(time.RFC3339), m.MessageID)
		} else {
			j.Why = fmt.Sprintf("consumer %s has a marker for key %q", consumer, r.Key)
		}
	case idem.Expired:
		j.Verdict = Expire
		j.Why = fmt.Sprintf("consumer %s expires it: %v", consumer, r.Err)
		if r.PrunedOn.IsZero() {
			j.Why += "; the consumer expires it before it looks at any marker"
		}
	case idem.DeadLettered:
		j.Verdict = Invalid
		j.Why = fmt.Sprintf("consumer %s dead-letters it: %v", consumer, r.Err)
	case idem.Applied:
		if !r.PrunedOn.IsZero() {
			j.Verdict = Expire
			j.Why = fmt.Sprintf("key %q is probably among the markers a prune deleted on %s (a pruned-key summary holds it): a late duplicate, which consumer %s would apply again (it does not set RefuseLate)", r.Key, r.PrunedOn.UTC().Format(time.DateOnly), consumer)
			break
		}
		j.Verdict = Apply
		j.Why = fmt.Sprintf("consumer %s has no marker for key %q: it applies it", consumer, r.Key)
		switch {
		case r.Untimed && !l.Time.IsZero():
			j.Why += fmt.Sprintf("; its event time %s is too far ahead, so the consumer takes it as untimed and the horizon cannot judge it", l.Time.UTC().Format(time.RFC3339))
		case r.Untimed:
			j.Why += "; the message has no event time, so the horizon cannot judge it"
		}
	default:
		j.Verdict = Unknown
		j.Why = fmt.Sprintf("consumer %s predicts %s: %v", consumer, r.Outcome, r.Err)
	}
	return j
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

// ErrMarkerChanged is returned when the marker a replay judged is no
// longer the key's: another replay retired it (and its re-application may
// have written a new one), or a replay of the same message retired the key's
// marker before the judged one was written, which is then that replay's
// effect. Retiring it would apply the message once more than asked.
var ErrMarkerChanged = errors.New("the marker judged is no longer the key's, or a replay of the message wrote it")

// retireJudged retires m, the marker of (consumer, key) a replay of
// message replayOf judged, in one statement and one transaction that both
// decide and act: the marker is deleted only while it is still m (same
// message ID and write time), and only when no replay of replayOf retired a
// marker of the key before m was written (m would be that replay's effect).
// A concurrent replay of the same letter that judged m too waits on the
// row, finds it gone and gets [ErrMarkerChanged]: each letter is applied
// at most once more, however many replays race.
func (in *Inbox) retireJudged(ctx context.Context, consumer, key, replayOf string, m *idemstore.Marker, r Retirement) (Retired, error) {
	if m == nil {
		return Retired{}, fmt.Errorf("%w: consumer %s, key %q in %s", ErrNoMarker, consumer, key, in.cfg.Table)
	}
	if strings.TrimSpace(r.By) == "" || strings.TrimSpace(r.Why) == "" {
		return Retired{}, errors.New("retiring a marker needs who and why")
	}
	if err := in.ensureAudit(ctx); err != nil {
		return Retired{}, err
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return Retired{}, fmt.Errorf("retiring the marker of %q: %w", key, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var out Retired
	var et *time.Time
	err = tx.QueryRow(ctx, `WITH gone AS (
    DELETE FROM `+in.table.Sanitize()+` AS i WHERE i.consumer = $1 AND i.key = $2 AND i.message_id = $7 AND i.processed_at = $8
      AND NOT EXISTS (
        SELECT 1 FROM `+in.audit+` AS a
        WHERE a.inbox_table = $5 AND a.consumer = $1 AND a.key = $2 AND a.replay_of = $6 AND a.restores IS NULL
          AND a.retired_at <= $8
          AND NOT EXISTS (SELECT 1 FROM `+in.audit+` AS b WHERE b.restores = a.id))
    RETURNING i.*
)
INSERT INTO `+in.audit+` (retired_by, why, inbox_table, consumer, key, message_id, replay_of, body_sha256, event_time, processed_at, keep_until, marker)
SELECT $3, $4, $5, g.consumer, g.key, g.message_id, $6, g.body_sha256, g.event_time, g.processed_at, g.keep_until, to_jsonb(g) FROM gone AS g
RETURNING id, retired_at, retired_by, why, inbox_table, consumer, key, message_id, replay_of, body_sha256, event_time, processed_at, keep_until`,
		consumer, key, r.By, r.Why, in.cfg.Table, replayOf, m.MessageID, m.ProcessedAt).Scan(&out.ID, &out.RetiredAt, &out.RetiredBy, &out.Why, &out.InboxTable,
		&out.Consumer, &out.Key, &out.MessageID, &out.ReplayOf, &out.BodySHA256, &et, &out.ProcessedAt, &out.KeepUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return Retired{}, fmt.Errorf("%w: consumer %s, key %q in %s: marker of message %q written %s", ErrMarkerChanged, consumer, key, in.cfg.Table, m.MessageID, m.ProcessedAt.UTC().Format(time.RFC3339Nano))
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
func (in *Inbox) replayedBefore(ctx context.Context, consumer, key, replayOf string, m *idemstore.Marker) (*Retired, error) {
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
