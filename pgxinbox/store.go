package pgxinbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
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
	// Table is the inbox table, optionally schema-qualified
	// ("billing.inbox"). Defaults to "idem_inbox". Each part must match
	// ^[A-Za-z_][A-Za-z0-9_]{0,62}$.
	Table string
	// Layout is the table's layout: [Plain] (the default), pruned by batched
	// DELETE, or [Partitioned] by day of partition time, whose old
	// partitions are dropped. It is fixed when the table is created;
	// [Store.Migrate] refuses a table of the other layout.
	Layout Layout
	// Window is how long markers are kept: on the plain layout counted from
	// their keep_until (the latest of their write time and the event times
	// of the messages that met them); on the partitioned layout by
	// partition time, a whole day at a time. It is stored with the table
	// by [Store.Migrate] when the table is created (14 days when 0), and
	// read from there by every processor, prune and CLI; a different
	// non-zero Window on an existing table makes Migrate fail (change the
	// stored one with [Store.SetWindow] or `idem inbox window set`).
	Window time.Duration
	// Hooks receive retention metrics (markers pruned, partitions dropped,
	// oldest marker age: the retention package's hook interfaces),
	// labelled with Table as written. Optional.
	Hooks []idem.Hook
	// Logger logs changes of the stored window. Defaults to slog.Default().
	Logger *slog.Logger
}

// Layout is how an inbox table is laid out on disk ([idemstore.Layout]).
type Layout = idemstore.Layout

const (
	// Plain is one table with PRIMARY KEY (consumer, key); [Store.Prune]
	// deletes old markers in bounded batches, by keep_until.
	Plain = idemstore.LayoutPlain
	// Partitioned is a table partitioned by RANGE (partition_time), one
	// partition per UTC day, with PRIMARY KEY (consumer, key,
	// partition_time): PostgreSQL only enforces uniqueness inside a
	// partition, so the partition column is part of the key, and it must be
	// a function of the key alone (idemstore.Claim.PartitionTime: the time in a
	// UUIDv7 message ID, or a period the business key names) for every copy
	// of a message, whatever its timestamps, to land on its marker. A claim
	// without a partition time is refused with a permanent error
	// (dead-lettered). Expired days go with [Store.DropPartitions], which
	// writes no WAL per row and leaves no dead tuples.
	Partitioned = idemstore.LayoutPartitioned
)

// ErrNoEventTime is the partitioned inbox's refusal of a claim without a
// partition time; it is [idem.ErrNoPartitionTime].
//
// Deprecated: use idem.ErrNoPartitionTime.
var ErrNoEventTime = idem.ErrNoPartitionTime

// ErrNoPartition is wrapped by a partitioned inbox's claim when no partition
// covers a message's partition time: partitions were not created far
// enough ahead (run [Store.EnsurePartitions] daily), or the message is older
// than the oldest partition (a consumer without the horizon guard). It is
// transient: the message is retried, then left to the broker, not lost.
var ErrNoPartition = errors.New("no inbox partition covers the message's partition time (create partitions ahead: idem inbox partitions ensure)")

// Store is the PostgreSQL inbox on pgx. It implements idemstore.Store[pgx.Tx]:
// handlers receive the pgx.Tx that holds their claim.
type Store struct {
	db    DB
	table pgx.Identifier
	name  string // quoted table name
	inbox *inboxdb.Inbox
	sql   *inboxdb.Dialect

	layout Layout
	// window is the configured window until Migrate or Settings read the
	// stored one (nanoseconds).
	window atomic.Int64
	hooks  []idem.Hook
	// lockSetting is the last lock timeout's setting.
	lockSetting atomic.Pointer[lockSetting]
	// mustCommit holds the transactions whose claim wrote a standby
	// barrier (durable.go).
	mustCommit commitNeeds
}

var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// New returns a store on db. Call [Store.Migrate] once before use.
func New(db DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: pgxinbox: db is nil", idem.ErrConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = "idem_inbox"
	}
	id, err := parseIdent(c.Table)
	if err != nil {
		return nil, err
	}
	if c.Layout != Plain && c.Layout != Partitioned {
		return nil, fmt.Errorf("%w: pgxinbox: unknown layout %d", idem.ErrConfig, c.Layout)
	}
	if c.Window < 0 {
		return nil, fmt.Errorf("%w: pgxinbox: window %v must be positive", idem.ErrConfig, c.Window)
	}
	t := inboxdb.Table{Name: id[len(id)-1]}
	if len(id) == 2 {
		t.Schema = id[0]
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	s := &Store{db: db, table: id, name: id.Sanitize(), layout: c.Layout, hooks: c.Hooks}
	s.sql = inboxdb.Postgres(t, c.Layout)
	s.inbox = &inboxdb.Inbox{D: s.sql, Driver: inboxdb.Pgx(db), Window: c.Window, Hooks: s.hooks, Logger: c.Logger}
	w := c.Window
	if w == 0 {
		w = retention.DefaultWindow
	}
	s.window.Store(int64(w))
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

// Layout returns the table's layout ([idemstore.Store.Layout]).
func (s *Store) Layout() Layout { return s.layout }

// Window returns the retention window: the stored one once [Store.Migrate]
// or [Store.Settings] has read it, the configured one before.
func (s *Store) Window() time.Duration { return time.Duration(s.window.Load()) }

// Settings reads the layout and window stored with the table
// ([idemstore.Store.Settings]).
func (s *Store) Settings(ctx context.Context) (idemstore.Settings, error) {
	set, err := s.inbox.Settings(ctx)
	if err == nil {
		s.window.Store(int64(set.Window))
	}
	return set, err
}

// SettingsIn is Settings read in tx, a transaction the caller holds
// ([idemstore.Store.SettingsIn]).
func (s *Store) SettingsIn(ctx context.Context, tx pgx.Tx) (idemstore.Settings, error) {
	set, err := s.inbox.SettingsIn(ctx, inboxdb.PgxTxConn(tx))
	if err == nil {
		s.window.Store(int64(set.Window))
	}
	return set, err
}

// SetWindow changes the window stored with the table and logs the old and
// new values; it refuses, unless force is set, a window under an hour or
// shorter than the longest horizon a consumer recorded. It returns the old
// window. See [inboxdb.Inbox.SetWindow] for lengthening.
func (s *Store) SetWindow(ctx context.Context, w time.Duration, force bool) (time.Duration, error) {
	old, err := s.inbox.SetWindow(ctx, w, force)
	if err == nil {
		s.window.Store(int64(w))
	}
	return old, err
}

// WindowStatus reads the window stored with the table and the guard window
// processors may use now: the same, except after a lengthening, when the
// guard grows from the old window as markers age into the new one.
func (s *Store) WindowStatus(ctx context.Context) (stored, guard time.Duration, err error) {
	return s.inbox.Stored(ctx)
}

// RecordHorizon records the horizon consumer guards with, beside the settings
// ([idemstore.Store.RecordHorizon]), so that [Store.SetWindow] can refuse to
// shorten the window below it.
func (s *Store) RecordHorizon(ctx context.Context, consumer string, horizon time.Duration) error {
	return s.inbox.RecordHorizon(ctx, consumer, horizon)
}

// Horizons lists the horizons consumers recorded, longest first.
func (s *Store) Horizons(ctx context.Context) ([]retention.RecordedHorizon, error) {
	return s.inbox.Horizons(ctx)
}

// Begin starts a transaction. On a pool or a connection its BEGIN travels
// with its first statement (the claim's, in a processor's transaction)
// instead of waiting for an answer of its own; the connection is taken now.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.begin(ctx)
	if err == nil {
		s.mustCommit.begun(tx)
	}
	return tx, err
}

func (s *Store) begin(ctx context.Context) (pgx.Tx, error) {
	t, err := beginTx(ctx, s.db)
	switch {
	case err != nil:
		return nil, err
	case t != nil:
		return t, nil
	}
	return s.db.Begin(ctx)
}

// Commit commits tx. When the outcome is unknown — no answer from the
// server, or the session ended around the COMMIT — the error wraps
// [idemstore.ErrCommitUnknown]: the transaction may have committed.
func (s *Store) Commit(ctx context.Context, tx pgx.Tx) error {
	defer s.mustCommit.end(tx)
	err := tx.Commit(ctx)
	if err != nil && pgerr.CommitUnknown(err) {
		return fmt.Errorf("%w: %w", idemstore.ErrCommitUnknown, err)
	}
	return err
}

// Rollback rolls tx back.
func (s *Store) Rollback(ctx context.Context, tx pgx.Tx) error {
	s.mustCommit.end(tx)
	return tx.Rollback(ctx)
}

// lockTimeoutSetting is the lock_timeout for a claim's wait: whole
// milliseconds, at least 1, because "0ms" means no limit to PostgreSQL.
// The last one made is kept: a processor asks for the same every time.
func (s *Store) lockTimeoutSetting(d time.Duration) string {
	if l := s.lockSetting.Load(); l != nil && l.d == d {
		return l.s
	}
	l := &lockSetting{d: d, s: fmt.Sprintf("%dms", max(d.Milliseconds(), 1))}
	s.lockSetting.Store(l)
	return l.s
}

// lockSetting is a lock timeout and its setting.
type lockSetting struct {
	d time.Duration
	s string
}

func timestamptz(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// Claim inserts the markers with one statement, which also sets the lock
// timeout. When it finds markers it did not insert, on a server with
// synchronous standbys, it writes one WAL record in tx and tx must be
// committed ([Store.NeedsCommit]): that COMMIT returns once the standbys
// hold the markers found (durable.go), so that no Duplicate is
// acknowledged on a marker a failover could lose. A caller of
// idem.Processor.ProcessTx commits its transaction anyway.
// On the partitioned layout a claim without a partition time is
// refused with a permanent error wrapping idem.ErrNoPartitionTime.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, consumer string, claims []idemstore.Claim, lockTimeout time.Duration) ([]bool, error) {
	if s.layout == Partitioned {
		for _, c := range claims {
			if c.PartitionTime.IsZero() {
				return nil, idem.Permanent(fmt.Errorf("claiming key %q of message %s: %w: the partitioned inbox places a marker by a partition time that is a function of the key alone",
					c.Key, c.MessageID, idem.ErrNoPartitionTime))
			}
		}
	}
	inserted, err := s.claim(ctx, tx, consumer, claims, lockTimeout)
	if err != nil {
		if pt, ok := tx.(*pendingTx); ok && pgerr.ReadOnly(err) {
			pt.readOnly = true // a standby or a fenced primary: dial again
		}
		if s.layout == Partitioned && missingPartition(err) {
			// A day older than the window was dropped on purpose: its
			// markers are gone, so such a message cannot be proven new
			// (the processor's horizon guard normally stops it first).
			cutoff := time.Now().Add(-s.Window())
			for _, c := range claims {
				if c.PartitionTime.Before(cutoff) {
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
	if anyFound(inserted) {
		// A marker found may be on the primary alone (see durable.go).
		if err := s.barrier(ctx, tx); err != nil {
			return nil, err
		}
	}
	return inserted, nil
}

// claim sends the claim statement and reads which claims it inserted.
func (s *Store) claim(ctx context.Context, tx pgx.Tx, consumer string, claims []idemstore.Claim, lockTimeout time.Duration) ([]bool, error) {
	inserted := make([]bool, len(claims))
	if len(claims) == 1 {
		// A message on its own: one row, no arrays to encode or unnest.
		c := claims[0]
		sql := s.sql.ClaimOne
		args := make([]any, 0, 7)
		args = append(args, consumer, c.Key, c.MessageID, bodyHash(c.BodySHA256), timestamptz(c.EventTime))
		if s.layout == Partitioned {
			args = append(args, timestamptz(c.PartitionTime))
		}
		if lockTimeout > 0 {
			sql = s.sql.ClaimOneLocked
			args = append(args, s.lockTimeoutSetting(lockTimeout))
		}
		if pt, ok := tx.(*pendingTx); ok && pt.pending() {
			err := pt.sendBegun(ctx, func(b *pgx.Batch) {
				b.Queue(sql, args...).Exec(func(tag pgconn.CommandTag) error {
					inserted[0] = tag.RowsAffected() == 1
					return nil
				})
			})
			if err != nil {
				return nil, err
			}
			return inserted, nil
		}
		tag, err := tx.Exec(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		inserted[0] = tag.RowsAffected() == 1
		return inserted, nil
	}
	keys := make([]string, len(claims))
	ids := make([]string, len(claims))
	hashes := make([][]byte, len(claims))
	times := make([]pgtype.Timestamptz, len(claims))
	for i, c := range claims {
		keys[i], hashes[i], times[i] = c.Key, bodyHash(c.BodySHA256), timestamptz(c.EventTime)
		if c.MessageID != c.Key {
			ids[i] = c.MessageID // '' stands for the key (see inboxdb.Postgres)
		}
	}
	sql := s.sql.Claim.SQL
	args := make([]any, 0, 7)
	args = append(args, consumer, keys, ids, hashes, times)
	if s.layout == Partitioned {
		parts := make([]pgtype.Timestamptz, len(claims))
		for i, c := range claims {
			parts[i] = timestamptz(c.PartitionTime)
		}
		args = append(args, parts)
	}
	if lockTimeout > 0 {
		sql = s.sql.ClaimLocked
		args = append(args, s.lockTimeoutSetting(lockTimeout))
	}
	won := make(map[string]struct{}, len(claims))
	read := func(rows pgx.Rows) error {
		var k string
		_, err := pgx.ForEachRow(rows, []any{&k}, func() error {
			won[k] = struct{}{}
			return nil
		})
		return err
	}
	if pt, ok := tx.(*pendingTx); ok && pt.pending() {
		if err := pt.sendBegun(ctx, func(b *pgx.Batch) { b.Queue(sql, args...).Query(read) }); err != nil {
			return nil, err
		}
	} else {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		if err := read(rows); err != nil {
			return nil, err
		}
	}
	for i, c := range claims {
		_, inserted[i] = won[c.Key]
	}
	return inserted, nil
}

// bodyHash is a claim's body hash as the NOT NULL column takes it: an absent
// hash is empty.
func bodyHash(h []byte) []byte {
	if h == nil {
		return []byte{}
	}
	return h
}

// Lookup returns the markers of keys, with their keep-until times.
func (s *Store) Lookup(ctx context.Context, tx pgx.Tx, consumer string, keys []string) (map[string]idemstore.Marker, error) {
	rows, err := tx.Query(ctx, s.sql.Lookup.SQL, consumer, keys)
	if err != nil {
		return nil, err
	}
	out := make(map[string]idemstore.Marker, len(keys))
	var m idemstore.Marker
	_, err = pgx.ForEachRow(rows, []any{&m.Key, &m.MessageID, &m.BodySHA256, &m.ProcessedAt, &m.KeepUntil}, func() error {
		out[m.Key] = m
		m.BodySHA256 = nil // the next scan must not reuse this buffer
		return nil
	})
	return out, err
}

// Extend raises the keep-until time of markers to the given times where they
// are later than the stored ones, in one statement that writes nothing where
// nothing grows ([idemstore.Store.Extend]). A key given twice keeps its
// latest time.
func (s *Store) Extend(ctx context.Context, tx pgx.Tx, consumer string, ext []idemstore.Extension) error {
	keys, times := extensions(ext)
	if len(keys) == 0 {
		return nil
	}
	ts := make([]pgtype.Timestamptz, len(times))
	for i, t := range times {
		ts[i] = timestamptz(t)
	}
	_, err := tx.Exec(ctx, s.sql.Extend.SQL, consumer, keys, ts)
	return err
}

// extensions returns each key once, in key order (so that two extending
// transactions lock rows in the same order), with its latest time; zero
// times are skipped.
func extensions(ext []idemstore.Extension) ([]string, []time.Time) {
	latest := make(map[string]time.Time, len(ext))
	for _, e := range ext {
		if e.KeepUntil.IsZero() {
			continue
		}
		if t, ok := latest[e.Key]; !ok || e.KeepUntil.After(t) {
			latest[e.Key] = e.KeepUntil
		}
	}
	keys := make([]string, 0, len(latest))
	for k := range latest {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	times := make([]time.Time, len(keys))
	for i, k := range keys {
		times[i] = latest[k]
	}
	return keys, times
}

// Classify decides by SQLSTATE (see package internal/pgerr).
func (s *Store) Classify(err error) idemstore.ErrorClass { return pgerr.Classify(err) }

// Classify is the SQLSTATE-based error classification of [Store.Classify],
// for code outside a store.
func Classify(err error) idemstore.ErrorClass { return pgerr.Classify(err) }

var _ idemstore.Store[pgx.Tx] = (*Store)(nil)

// PrunedSummaries returns consumer's summaries of the keys prunes deleted,
// newest first: the processor loads them with the settings and checks every
// fresh key against them (idem.Config.RefuseLate).
func (s *Store) PrunedSummaries(ctx context.Context, consumer string) ([]idemstore.PrunedSummary, error) {
	return s.inbox.PrunedSummaries(ctx, consumer)
}

// PrunedSummariesIn is PrunedSummaries read in tx, a transaction the
// caller holds ([idemstore.Store.SettingsIn]).
func (s *Store) PrunedSummariesIn(ctx context.Context, tx pgx.Tx, consumer string) ([]idemstore.PrunedSummary, error) {
	return s.inbox.PrunedSummariesIn(ctx, inboxdb.PgxTxConn(tx), consumer)
}

// RecordPositions records consumer's position in each source of ps, in tx
// ([idemstore.Store.RecordPositions]).
func (s *Store) RecordPositions(ctx context.Context, tx pgx.Tx, consumer string, ps []idemstore.Position) error {
	return s.inbox.RecordPositions(ctx, inboxdb.PgxTxConn(tx), consumer, ps)
}

// Positions returns the positions recorded for consumer, by source
// ([idemstore.Store.Positions]).
func (s *Store) Positions(ctx context.Context, consumer string) ([]idemstore.Position, error) {
	return s.inbox.Positions(ctx, consumer)
}

// ForgetPositions deletes the positions recorded for consumer
// ([idemstore.Store.ForgetPositions]).
func (s *Store) ForgetPositions(ctx context.Context, consumer string) (int64, error) {
	return s.inbox.ForgetPositions(ctx, consumer)
}
