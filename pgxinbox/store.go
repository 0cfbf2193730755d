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
}

// Store is the PostgreSQL inbox on pgx. It implements idem.Store[pgx.Tx]:
// handlers receive the pgx.Tx that holds their claim.
type Store struct {
	db    DB
	table pgx.Identifier
	name  string // quoted table name
	sql   queries
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
	s := &Store{db: db, table: id, name: id.Sanitize()}
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
ON CONFLICT (consumer, key) DO NOTHING
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

// Begin starts a transaction.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.db.Begin(ctx) }

// Commit commits tx. When the connection fails before the server answers,
// the error wraps idem.ErrCommitUnknown: the transaction may have committed.
func (s *Store) Commit(ctx context.Context, tx pgx.Tx) error {
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback) {
		return err // the server answered: rolled back, outcome known
	}
	return fmt.Errorf("%w: %w", idem.ErrCommitUnknown, err)
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

// Classify decides by SQLSTATE: data exceptions (class 22) and integrity
// violations (class 23, such as a business table's unique index) fail the
// same way every time; everything else, including serialization failures,
// deadlocks, lock timeouts, admin shutdowns and lost connections, may
// succeed on another try.
func (s *Store) Classify(err error) idem.ErrorClass { return Classify(err) }

// Classify is the SQLSTATE-based error classification of [Store.Classify],
// for code outside a store.
func Classify(err error) idem.ErrorClass {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "22", "23":
			return idem.ClassPermanent
		}
	}
	return idem.ClassTransient
}
