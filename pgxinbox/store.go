package pgxinbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgerr"
	"github.com/idemkit/idem/retention"
)

// DB is what the store needs from a pool: *pgxpool.Pool satisfies it, and so
// does a single *pgx.Conn for tools that do not want a pool.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config configures a [Store].
type Config struct {
	// Table is the inbox table, optionally schema-qualified ("billing.inbox").
	// Defaults to "idem_inbox". Each part must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$.
	Table string
	// Layout is the table's layout: [Plain] (the default), pruned by batched
	// DELETE, or [Partitioned] by day of event time, whose old partitions are
	// dropped. It is fixed when the table is created; [Store.Migrate] refuses
	// a table of the other layout.
	Layout Layout
	// Window is how long markers are kept: on the plain layout counted from
	// the later of their event time and their write time; on the partitioned
	// layout by event time, a whole day at a time. Defaults to 14 days.
	// Processors adopt the matching guard ([Store.Horizon]) unless they set
	// their own, so the horizon guard and the prune agree (see package
	// retention for the proof).
	Window time.Duration
	// Hooks receives retention metrics (markers pruned, partitions dropped,
	// oldest marker age). Optional.
	Hooks retention.Hooks
}

// Layout is how an inbox table is laid out on disk.
type Layout int

const (
	// Plain is one table with PRIMARY KEY (consumer, key); [Store.Prune]
	// deletes old markers in bounded batches. Messages need no event time.
	Plain Layout = iota
	// Partitioned is a table partitioned by RANGE (event_time), one partition
	// per UTC day, with PRIMARY KEY (consumer, key, event_time): PostgreSQL
	// only enforces uniqueness inside a partition, so the partition column is
	// part of the key, and it must be a function of the message (the
	// producer's time or the time in a UUIDv7 ID) for a redelivery to land
	// in the same partition as the first delivery. A message without an
	// event time is refused with a permanent error (dead-lettered). Expired
	// days go with [Store.DropPartitions], which writes no WAL per row and
	// leaves no dead tuples.
	//
	// Because the event time is part of the key, two different messages
	// with the same business key but different event times are two effects:
	// use this layout with keys that determine their event time, such as
	// [idem.ByMessageID].
	Partitioned
)

// String names the layout as the CLI spells it.
func (l Layout) String() string {
	switch l {
	case Plain:
		return "plain"
	case Partitioned:
		return "partitioned"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// ErrNoEventTime is wrapped (inside an [idem.Permanent] error) by a
// partitioned inbox's claim of a message without an event time: the inbox
// could not tell a redelivery from a new message, so the message is
// dead-lettered rather than applied unguarded. Give messages a time
// (Message.Time: a producer header, [idem.TimeFromUUIDv7]).
var ErrNoEventTime = errors.New("message has no event time, which the partitioned inbox needs to find its marker")

// ErrNoPartition is wrapped by a partitioned inbox's claim when no partition
// covers a message's event time: partitions were not created far enough
// ahead (run [Store.EnsurePartitions] daily), or the message is older than
// the oldest partition (a consumer without the horizon guard). It is
// transient: the message is retried, then left to the broker, not lost.
var ErrNoPartition = errors.New("no inbox partition covers the message's event time (create partitions ahead: idem inbox partitions ensure)")

// Store is the PostgreSQL inbox on pgx. It implements idem.Store[pgx.Tx]:
// handlers receive the pgx.Tx that holds their claim.
type Store struct {
	db    DB
	table pgx.Identifier
	name  string // quoted table name
	sql   queries

	layout Layout
	window time.Duration
	hooks  retention.Hooks
}

type queries struct {
	claim, lookup string
}

var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// New returns a store on db. Call [Store.Migrate] once before use.
func New(db DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: pgxinbox: db is nil", idem.ErrConfig)
	}
	table := "idem_inbox"
	if cfg != nil && cfg.Table != "" {
		table = cfg.Table
	}
	id, err := parseIdent(table)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, table: id, name: id.Sanitize(), window: retention.DefaultWindow, hooks: retention.NopHooks{}}
	if cfg != nil {
		if cfg.Layout != Plain && cfg.Layout != Partitioned {
			return nil, fmt.Errorf("%w: pgxinbox: unknown layout %d", idem.ErrConfig, cfg.Layout)
		}
		if cfg.Window < 0 {
			return nil, fmt.Errorf("%w: pgxinbox: window %v must be positive", idem.ErrConfig, cfg.Window)
		}
		s.layout = cfg.Layout
		if cfg.Window > 0 {
			s.window = cfg.Window
		}
		s.hooks = retention.Or(cfg.Hooks, nil)
	}
	// The partitioned table's unique key includes the partition column; the
	// conflict target must name exactly that key.
	conflict := "(consumer, key)"
	if s.layout == Partitioned {
		conflict = "(consumer, key, event_time)"
	}
	// The claim is the whole point of the library; it is spelled out here,
	// once. Claims arrive sorted by key; WITH ORDINALITY keeps that order so
	// concurrent batches take row locks in the same order and cannot
	// deadlock. ON CONFLICT names the primary key so a user's other unique
	// indexes on the inbox are never silently absorbed.
	s.sql.claim = `INSERT INTO ` + s.name + ` AS i (consumer, key, message_id, body_sha256, event_time)
SELECT $1, c.key, c.message_id, c.body_sha256, c.event_time
FROM unnest($2::text[], $3::text[], $4::bytea[], $5::timestamptz[]) WITH ORDINALITY
     AS c(key, message_id, body_sha256, event_time, n)
ORDER BY c.n
ON CONFLICT ` + conflict + ` DO NOTHING
RETURNING i.key`
	s.sql.lookup = `SELECT key, message_id, body_sha256, processed_at FROM ` + s.name + `
WHERE consumer = $1 AND key = ANY($2::text[])`
	return s, nil
}

func parseIdent(name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: pgxinbox: table %q has more than schema.table", idem.ErrConfig, name)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return nil, fmt.Errorf("%w: pgxinbox: table %q: part %q must match %s", idem.ErrConfig, name, p, identPart)
		}
	}
	return pgx.Identifier(parts), nil
}

// Table returns the quoted inbox table name, for maintenance queries.
func (s *Store) Table() string { return s.name }

// Layout returns the table's layout.
func (s *Store) Layout() Layout { return s.layout }

// Window returns the retention window.
func (s *Store) Window() time.Duration { return s.window }

// Horizon returns the horizon guard that matches this store's retention, for
// idem.Config.Horizon: consumers then expire exactly the messages whose
// markers the prune may have removed.
func (s *Store) Horizon() idem.Horizon { return idem.Horizon{Window: s.window} }

// Begin starts a transaction.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.db.Begin(ctx) }

// Commit commits tx. When the outcome is unknown — no answer from the
// server, or the session ended around the COMMIT — the error wraps
// idem.ErrCommitUnknown: the transaction may have committed.
func (s *Store) Commit(ctx context.Context, tx pgx.Tx) error {
	err := tx.Commit(ctx)
	if err != nil && pgerr.CommitUnknown(err) {
		return fmt.Errorf("%w: %w", idem.ErrCommitUnknown, err)
	}
	return err
}

// Rollback rolls tx back.
func (s *Store) Rollback(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }

// Claim inserts the markers in one round trip: the lock timeout and the
// INSERT travel in one batch.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, consumer string, claims []idem.Claim, lockTimeout time.Duration) ([]bool, error) {
	keys := make([]string, len(claims))
	ids := make([]string, len(claims))
	hashes := make([][]byte, len(claims))
	times := make([]pgtype.Timestamptz, len(claims))
	for i, c := range claims {
		if s.layout == Partitioned && c.EventTime.IsZero() {
			return nil, idem.Permanent(fmt.Errorf("claiming key %q of message %s: %w", c.Key, c.MessageID, ErrNoEventTime))
		}
		keys[i], ids[i], hashes[i] = c.Key, c.MessageID, c.BodySHA256
		times[i] = pgtype.Timestamptz{Time: c.EventTime, Valid: !c.EventTime.IsZero()}
	}
	b := &pgx.Batch{}
	if lockTimeout > 0 {
		b.Queue(`SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", lockTimeout.Milliseconds()))
	}
	won := make(map[string]struct{}, len(claims))
	b.Queue(s.sql.claim, consumer, keys, ids, hashes, times).Query(func(rows pgx.Rows) error {
		var k string
		_, err := pgx.ForEachRow(rows, []any{&k}, func() error {
			won[k] = struct{}{}
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		if s.layout == Partitioned && missingPartition(err) {
			// A day older than the window was dropped on purpose: its
			// markers are gone, so such a message cannot be proven new
			// (the processor's horizon guard normally stops it first).
			cutoff := time.Now().Add(-s.window)
			for _, c := range claims {
				if c.EventTime.Before(cutoff) {
					return nil, idem.Permanent(fmt.Errorf("claiming key %q of message %s: %w: its day's partition was dropped (%v)", c.Key, c.MessageID, idem.ErrExpired, err))
				}
			}
			// A day not created yet will be (EnsurePartitions): transient.
			// %v, not %w: the server's error is a check violation (class
			// 23), which Classify would call permanent.
			return nil, fmt.Errorf("%w: %v", ErrNoPartition, err)
		}
		return nil, err
	}
	inserted := make([]bool, len(claims))
	for i, c := range claims {
		_, inserted[i] = won[c.Key]
	}
	return inserted, nil
}

// Lookup returns the markers of keys.
func (s *Store) Lookup(ctx context.Context, tx pgx.Tx, consumer string, keys []string) (map[string]idem.Marker, error) {
	rows, err := tx.Query(ctx, s.sql.lookup, consumer, keys)
	if err != nil {
		return nil, err
	}
	out := make(map[string]idem.Marker, len(keys))
	var m idem.Marker
	_, err = pgx.ForEachRow(rows, []any{&m.Key, &m.MessageID, &m.BodySHA256, &m.ProcessedAt}, func() error {
		out[m.Key] = m
		m.BodySHA256 = nil // the next scan must not reuse this buffer
		return nil
	})
	return out, err
}

// Classify decides by SQLSTATE: classes 22 and 23 are permanent, the rest
// transient (see package internal/pgerr).
func (s *Store) Classify(err error) idem.ErrorClass { return pgerr.Classify(err) }

// Classify is the SQLSTATE-based error classification of [Store.Classify],
// for code outside a store.
func Classify(err error) idem.ErrorClass { return pgerr.Classify(err) }
