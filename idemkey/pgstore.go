package idemkey

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/migrator"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// DB is what [PGStore] needs from a database: a *pgxpool.Pool, a *pgx.Conn
// (not for concurrent use) or a test double.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PGConfig configures a [PGStore].
type PGConfig struct {
	// Table is the keys table, optionally schema-qualified
	// ("payments.idempotency_keys"). Defaults to "idem_idempotency_keys".
	// Each part must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$.
	Table string
}

// ErrConfig is wrapped by the errors of an invalid [PGConfig].
var ErrConfig = errors.New("invalid idemkey configuration")

// PGStore is the [Store] on PostgreSQL through pgx. Call [PGStore.Migrate]
// once before use and [PGStore.Prune] periodically.
type PGStore struct {
	db    DB
	table pgx.Identifier
	name  string // quoted
	sql   struct{ claim, lookup, complete, extend, release, prune string }
}

var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// NewPGStore returns a store on db.
func NewPGStore(db DB, cfg *PGConfig) (*PGStore, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrConfig)
	}
	table := "idem_idempotency_keys"
	if cfg != nil && cfg.Table != "" {
		table = cfg.Table
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: table %q has more than schema.table", ErrConfig, table)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return nil, fmt.Errorf("%w: table %q: part %q must match %s", ErrConfig, table, p, identPart)
		}
	}
	s := &PGStore{db: db, table: pgx.Identifier(parts)}
	s.name = s.table.Sanitize()
	// The claim, spelled out once: insert the key, or take over a row whose
	// lease or TTL ran out. Of concurrent claims the primary key lets one
	// insert; the others wait for it and then find the row unexpired.
	s.sql.claim = `INSERT INTO ` + s.name + ` AS k (scope, key, fingerprint, token, expires_at)
VALUES ($1, $2, $3, $4, now() + $5::bigint * interval '1 millisecond')
ON CONFLICT (scope, key) DO UPDATE
SET fingerprint = EXCLUDED.fingerprint, token = EXCLUDED.token, status = NULL, header = NULL,
    body = NULL, created_at = now(), expires_at = EXCLUDED.expires_at
WHERE k.expires_at <= now()
RETURNING true`
	// The lookup skips the stored response of another request (a 422): it
	// is never replayed.
	s.sql.lookup = `SELECT fingerprint, status, CASE WHEN fingerprint = $3 THEN header END,
    CASE WHEN fingerprint = $3 THEN body END FROM ` + s.name + `
WHERE scope = $1 AND key = $2 AND expires_at > now()`
	s.sql.complete = `UPDATE ` + s.name + `
SET status = $4, header = $5::jsonb, body = $6, expires_at = now() + $7::bigint * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND token = $3 AND status IS NULL`
	s.sql.extend = `UPDATE ` + s.name + ` SET expires_at = now() + $4::bigint * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND token = $3 AND status IS NULL`
	s.sql.release = `DELETE FROM ` + s.name + ` WHERE scope = $1 AND key = $2 AND token = $3 AND status IS NULL`
	// Prune re-checks expires_at on the row it deletes, not only its ctid:
	// a takeover that commits while the DELETE waits on the row is no
	// longer expired and must stay.
	s.sql.prune = `DELETE FROM ` + s.name + ` WHERE ctid = ANY(ARRAY(
SELECT ctid FROM ` + s.name + ` WHERE expires_at < now() - $1::bigint * interval '1 millisecond' LIMIT $2))
AND expires_at < now() - $1::bigint * interval '1 millisecond'`
	return s, nil
}

// Table returns the quoted table name, for maintenance queries.
func (s *PGStore) Table() string { return s.name }

// Migrate creates the keys table and its index when missing, and records
// its schema version in idem_migrations beside it, as every idem table's. It
// is safe to call on every start and from several processes at once:
// migrators queue on one advisory lock, the one every idem migrator takes.
func (s *PGStore) Migrate(ctx context.Context) error {
	comp, err := s.component()
	if err != nil {
		return fmt.Errorf("migrating idempotency keys: %w", err)
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrating idempotency keys: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := migrator.Apply(ctx, migrator.PgxTx(tx), migrator.Postgres, comp); err != nil {
		return fmt.Errorf("migrating idempotency keys: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrating idempotency keys: %w", err)
	}
	return nil
}

func init() {
	migrator.Register("idemkey", func(p migrator.Params) (*migrator.Component, error) {
		if p.Engine != migrator.Postgres {
			return nil, fmt.Errorf("%w: idempotency keys are stored on PostgreSQL, not on %s", ErrConfig, p.Engine)
		}
		s, err := NewPGStore(noDB{}, &PGConfig{Table: p.Table})
		if err != nil {
			return nil, err
		}
		return s.component()
	})
}

// noDB lets the migrator validate and render a table without a database.
type noDB struct{ DB }

// component is the keys table as the one migrator of every idem table sees
// it. Before the version table, Migrate recorded nothing: a table that
// exists is at version 1, its only migration.
func (s *PGStore) component() (*migrator.Component, error) {
	index := pgx.Identifier{expiresIndex(s.table[len(s.table)-1])}.Sanitize()
	ms, err := migrator.Load(migrationFS, "migrations", struct{ Table, ExpiresIndex string }{s.name, index}, nil)
	if err != nil {
		return nil, err
	}
	book := pgx.Identifier{migrator.VersionTable}
	if len(s.table) == 2 {
		book = pgx.Identifier{s.table[0], migrator.VersionTable}
	}
	return &migrator.Component{
		Name:       "idemkey",
		Table:      strings.Join(s.table, "."),
		Key:        s.name,
		Book:       book.Sanitize(),
		Migrations: ms,
		Drop:       []string{`DROP TABLE IF EXISTS ` + s.name},
		Adopt: func(ctx context.Context, c migrator.Conn) (int, error) {
			var exists bool
			if err := c.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.name).Scan(&exists); err != nil {
				return 0, err
			}
			if exists {
				return 1, nil
			}
			return 0, nil
		},
	}, nil
}

// expiresIndex names the expires_at index of table. PostgreSQL puts an
// index in its table's schema: the name is unqualified. A name over 63 bytes
// would be truncated, and two long table names could share one (or the
// index could take the table's own name), so a long table name is cut and
// followed by a hash of the whole.
func expiresIndex(table string) string {
	const suffix = "_expires_at_idx"
	if len(table)+len(suffix) <= 63 {
		return table + suffix
	}
	sum := sha256.Sum256([]byte(table))
	return table[:39] + "_" + hex.EncodeToString(sum[:4]) + suffix // 39+1+8+15 = 63 bytes
}

// Claim implements [Store]. A key released or taken over between the
// insert and the lookup is claimed again.
func (s *PGStore) Claim(ctx context.Context, c Claim) (*Record, error) {
	if c.Fingerprint == nil {
		c.Fingerprint = []byte{} // nil would be NULL in a NOT NULL column
	}
	for attempt := 0; ; attempt++ {
		var won bool
		err := s.db.QueryRow(ctx, s.sql.claim, c.Scope, c.Key, c.Fingerprint, c.Token, millis(c.Lease)).Scan(&won)
		if err == nil {
			return nil, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("claiming idempotency key %q: %w", c.Key, err)
		}
		var (
			rec    Record
			status *int32
			header []byte
			body   []byte
		)
		err = s.db.QueryRow(ctx, s.sql.lookup, c.Scope, c.Key, c.Fingerprint).Scan(&rec.Fingerprint, &status, &header, &body)
		if errors.Is(err, pgx.ErrNoRows) && attempt < 3 {
			continue // released, or expired just now: the key is free again
		}
		if err != nil {
			return nil, fmt.Errorf("reading idempotency key %q: %w", c.Key, err)
		}
		if status != nil {
			rec.Response = &Response{Status: int(*status), Header: http.Header{}, Body: body}
			if len(header) > 0 {
				if err := json.Unmarshal(header, &rec.Response.Header); err != nil {
					return nil, fmt.Errorf("decoding stored headers of key %q: %w", c.Key, err)
				}
			}
			if rec.Response.Body == nil {
				rec.Response.Body = []byte{}
			}
		}
		return &rec, nil
	}
}

// Complete implements [Store].
func (s *PGStore) Complete(ctx context.Context, c Claim, resp Response) error {
	header, err := json.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("encoding headers of key %q: %w", c.Key, err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	tag, err := s.db.Exec(ctx, s.sql.complete, c.Scope, c.Key, c.Token, resp.Status, string(header), body, millis(c.TTL))
	if err != nil {
		return fmt.Errorf("storing response of key %q: %w", c.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("storing response of key %q: %w", c.Key, ErrLeaseLost)
	}
	return nil
}

// Extend implements [Store].
func (s *PGStore) Extend(ctx context.Context, c Claim) error {
	tag, err := s.db.Exec(ctx, s.sql.extend, c.Scope, c.Key, c.Token, millis(c.Lease))
	if err != nil {
		return fmt.Errorf("extending lease of key %q: %w", c.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("extending lease of key %q: %w", c.Key, ErrLeaseLost)
	}
	return nil
}

// millis is d in whole milliseconds, the resolution of the SQL, rounded up
// so that a positive lease or TTL never becomes none.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Release implements [Store].
func (s *PGStore) Release(ctx context.Context, c Claim) error {
	if _, err := s.db.Exec(ctx, s.sql.release, c.Scope, c.Key, c.Token); err != nil {
		return fmt.Errorf("releasing idempotency key %q: %w", c.Key, err)
	}
	return nil
}

// pruneBatch bounds each DELETE of Prune, so that no statement holds many
// row locks or runs for long.
const pruneBatch = 1000

// Prune deletes the records that expired more than olderThan ago (0: every
// expired record), in batches of a thousand rows, and returns how many it
// deleted. Expired records are already ignored by Claim; pruning reclaims
// their space. Run it periodically, for instance hourly.
func (s *PGStore) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: prune olderThan %v is negative", ErrConfig, olderThan)
	}
	var total int64
	for {
		tag, err := s.db.Exec(ctx, s.sql.prune, olderThan.Milliseconds(), pruneBatch)
		if err != nil {
			return total, fmt.Errorf("pruning idempotency keys: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}
