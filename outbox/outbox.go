package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/sqlinbox"
)

// Defaults of [Config].
const (
	DefaultTable   = "idem_outbox"
	DefaultShards  = 16
	DefaultMaxBody = 1 << 20
)

// Config configures an [Outbox]. The zero value is usable.
type Config struct {
	// Table is the outbox table, optionally schema-qualified on
	// PostgreSQL. Defaults to "idem_outbox". Its siblings <table>_leases,
	// <table>_relays and <table>_meta hold the relays' leases and the
	// stored shard count.
	Table string
	// Shards is the number of shards the rows are spread over by key; at
	// most this many relays work at once. It is stored with the table by
	// Migrate and read from there afterwards: 0 means the stored count (or
	// DefaultShards, 16, for a new table); a different non-zero count than
	// the stored one is refused.
	Shards int
	// MaxBody bounds a message's body in bytes. Defaults to 1 MiB.
	MaxBody int
	// NowFunc is the clock of event times and IDs. Defaults to time.Now.
	NowFunc func() time.Time
}

// Outbox writes messages into the outbox table inside the caller's
// transaction (a pgx.Tx or a *sql.Tx), and is what a [Relay] publishes
// from. It is safe for concurrent use.
type Outbox[TTx any] struct {
	*core
	conn func(TTx) inboxdb.Conn
}

// core is the part of an outbox that does not depend on the transaction
// type: what the relay, Stats, Prune and Retry use.
type core struct {
	table   inboxdb.Table
	s       *statements
	drv     inboxdb.Driver
	cfg     Config
	channel string // NOTIFY channel
	// listen holds one session that LISTENs on channel and calls wake on
	// each notification, until ctx is done; nil without LISTEN (SQLite, a
	// lone *pgx.Conn).
	listen func(ctx context.Context, wake func()) error
	// serialRead is set on SQLite: a read after an in-process wake waits
	// for the write lock, i.e. for the enqueuing transaction to end.
	serialRead bool

	mu     sync.Mutex
	shards int // 0 until read from the table
	wakes  map[chan struct{}]struct{}
}

// PgxDB is what NewPgx needs: a *pgxpool.Pool or a *pgx.Conn.
type PgxDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// NewPgx returns the outbox of a pgx pool or connection; its transactions
// are pgx.Tx. A *pgxpool.Pool also gives relays LISTEN/NOTIFY, each relay
// on a session of its own dialed with the pool's connection configuration,
// which does not count against the pool's MaxConns (the pool's
// BeforeConnect and AfterConnect hooks do not run for it). A *pgx.Conn is
// not safe for concurrent use: an outbox on one serves a relay alone (which
// then polls), or Enqueue alone.
func NewPgx(db PgxDB, cfg *Config) (*Outbox[pgx.Tx], error) {
	if db == nil {
		return nil, fmt.Errorf("%w: outbox: db is nil", idem.ErrConfig)
	}
	c, err := newCore("postgres", inboxdb.Pgx(db), cfg)
	if err != nil {
		return nil, err
	}
	if pool, ok := db.(*pgxpool.Pool); ok {
		// The session is dialed from the pool's configuration, outside
		// the pool: a relay holds it for as long as it runs, and taken
		// from the pool it would leave one relay on a pool of one (or
		// four on a pool of four) no connection to lease, read and mark.
		c.listen = func(ctx context.Context, wake func()) error {
			return listenDialed(ctx, pool.Config().ConnConfig, c.channel, wake)
		}
	}
	return &Outbox[pgx.Tx]{core: c, conn: inboxdb.PgxTxConn}, nil
}

// NewSQL returns the outbox of a database/sql pool; its transactions are
// *sql.Tx. dialect is [sqlinbox.Postgres] (the pgx stdlib driver, which
// also gives relays LISTEN/NOTIFY, on sessions outside db's pool dialed
// with its connections' configuration) or [sqlinbox.SQLite] (polling, and
// an in-process wake of the relays of this Outbox value).
func NewSQL(db *sql.DB, dialect sqlinbox.Dialect, cfg *Config) (*Outbox[*sql.Tx], error) {
	if db == nil || dialect == nil {
		return nil, fmt.Errorf("%w: outbox: db and dialect are required", idem.ErrConfig)
	}
	name := dialect.Name()
	if name != "postgres" && name != "sqlite" {
		return nil, fmt.Errorf("%w: outbox: unsupported dialect %s", idem.ErrConfig, name)
	}
	c, err := newCore(name, inboxdb.SQL(db, name == "sqlite"), cfg)
	if err != nil {
		return nil, err
	}
	if name == "postgres" {
		c.listen = (&sqlListener{db: db, channel: c.channel}).listen
	} else {
		c.serialRead = true
	}
	return &Outbox[*sql.Tx]{core: c, conn: sqlTxConn}, nil
}

func sqlTxConn(tx *sql.Tx) inboxdb.Conn { return inboxdb.SQLTxConn(tx) }

// maxIdentLen is PostgreSQL's identifier limit in bytes.
const maxIdentLen = 63

var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,48}$`)

func newCore(dialect string, drv inboxdb.Driver, cfg *Config) (*core, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.NowFunc == nil {
		c.NowFunc = time.Now
	}
	switch {
	case c.Shards < 0 || c.Shards > 4096:
		return nil, fmt.Errorf("%w: outbox: shards %d: want 1 to 4096, or 0 for the stored count", idem.ErrConfig, c.Shards)
	case c.MaxBody < 0:
		return nil, fmt.Errorf("%w: outbox: max body %d must be positive", idem.ErrConfig, c.MaxBody)
	}
	parts := strings.Split(c.Table, ".")
	if len(parts) > 2 || (len(parts) == 2 && dialect == "sqlite") {
		return nil, fmt.Errorf("%w: outbox: table name %q: want table or (PostgreSQL) schema.table", idem.ErrConfig, c.Table)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return nil, fmt.Errorf("%w: outbox: table name %q: each part must match %s (room is left for the _leases, _relays and _meta siblings)", idem.ErrConfig, c.Table, identPart)
		}
	}
	t := inboxdb.Table{Name: parts[len(parts)-1]}
	if len(parts) == 2 {
		t.Schema = parts[0]
	}
	channel := t.String()
	if len(channel) > maxIdentLen {
		// NOTIFY channels are identifiers, cut at 63 bytes.
		f := fnv.New64a()
		f.Write([]byte(channel))
		channel = fmt.Sprintf("idem_outbox_%016x", f.Sum64())
	}
	return &core{
		table:   t,
		s:       newStatements(dialect, t),
		drv:     drv,
		cfg:     c,
		channel: channel,
		wakes:   map[chan struct{}]struct{}{},
	}, nil
}

// Table is the outbox table's name, as configured.
func (c *core) tableName() string { return c.table.String() }

// ErrNoTable is the error of an outbox whose table was never migrated
// (see [Outbox.Migrate], or idem outbox migrate).
var ErrNoTable = errors.New("the outbox table does not exist: run Migrate (or idem outbox migrate) first")

// wrap says what failed on the outbox, and marks a missing table with
// ErrNoTable.
func (c *core) wrap(doing string, err error) error {
	if c.s.missing(err) || isNoRows(err) {
		return fmt.Errorf("%s of outbox %s: %w (%w)", doing, c.table, ErrNoTable, err)
	}
	return fmt.Errorf("%s of outbox %s: %w", doing, c.table, err)
}

// shardCount is the stored shard count, read once.
func (c *core) shardCount(ctx context.Context) (int, error) {
	c.mu.Lock()
	n := c.shards
	c.mu.Unlock()
	if n > 0 {
		return n, nil
	}
	err := c.drv.Read(ctx, func(conn inboxdb.Conn) error { return conn.QueryRow(ctx, c.s.shardsNow).Scan(&n) })
	if err != nil {
		return 0, c.wrap("reading the shard count", err)
	}
	c.mu.Lock()
	c.shards = n
	c.mu.Unlock()
	return n, nil
}

// shardOf is the shard of a row: its key's, or for a row without a key,
// its ID's (such rows carry no order, so they spread).
func shardOf(key, id string, shards int) int {
	h := fnv.New32a()
	if key != "" {
		h.Write([]byte(key))
	} else {
		h.Write([]byte(id))
	}
	return int(h.Sum32() % uint32(shards))
}

// subscribe registers an in-process wake channel; the returned func
// removes it.
func (c *core) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	c.wakes[ch] = struct{}{}
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		delete(c.wakes, ch)
		c.mu.Unlock()
	}
}

func (c *core) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ch := range c.wakes {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Enqueue writes msgs into the outbox inside tx, the caller's transaction
// (in an idem handler, the handler's own): they are published once tx
// commits, and never if it rolls back. It returns each message's ID, a
// UUIDv7 whose time is the message's event time: the publishers send it as
// the message ID, so the downstream idem consumer skips a republish.
//
// On PostgreSQL, Enqueue locks each key for the rest of tx (a
// transaction-scoped advisory lock, taken in one order), so that two
// transactions writing the same key commit in the order of their rows;
// transactions that enqueue the same keys wait for each other. Enqueue a
// transaction's messages in one call: the keys of one call are locked in
// one order, but a transaction that enqueues key A and then, in a later
// call, key B can deadlock with one that does B then A (PostgreSQL aborts
// one of them). It also
// notifies the relays, on commit. A message that fails validation is
// refused with [ErrInvalid] and nothing is written.
func (o *Outbox[TTx]) Enqueue(ctx context.Context, tx TTx, msgs ...Message) (ids []string, err error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	for i := range msgs {
		if err := msgs[i].validate(i, o.cfg.MaxBody); err != nil {
			return nil, err
		}
	}
	conn := o.conn(tx)
	// The shard count, when not read yet, is read in tx itself: another
	// connection could be the pool's last (enqueuers would wait for each
	// other), and a read of its own on a *pgx.Conn would end tx.
	o.mu.Lock()
	shards := o.shards
	o.mu.Unlock()
	if shards == 0 {
		if err := conn.QueryRow(ctx, o.s.shardsNow).Scan(&shards); err != nil {
			return nil, fmt.Errorf("enqueueing: %w", o.wrap("reading the shard count", err))
		}
		o.mu.Lock()
		o.shards = shards
		o.mu.Unlock()
	}
	if o.s.lockKeys != "" {
		keys := make([]string, 0, len(msgs))
		for _, m := range msgs {
			if m.Key != "" {
				keys = append(keys, m.Key)
			}
		}
		if len(keys) > 0 {
			sort.Strings(keys)
			var n int64
			if err := conn.QueryRow(ctx, o.s.lockKeys, o.table.Quoted(), keys).Scan(&n); err != nil {
				return nil, fmt.Errorf("enqueueing into outbox %s: locking the keys: %w", o.table, err)
			}
		}
	}
	now := o.cfg.NowFunc()
	ids = make([]string, len(msgs))
	for i, m := range msgs {
		id := idem.NewUUIDv7(now)
		eventTime, _ := idem.TimeFromUUIDv7(id)
		var headers any
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("enqueueing: encoding headers: %w", err)
			}
			headers = string(b)
		}
		body := m.Body
		if body == nil {
			body = []byte{}
		}
		if _, err := conn.Exec(ctx, o.s.insert, id, m.Destination, m.RoutingKey, m.Key, shardOf(m.Key, id, shards),
			headers, body, o.s.timeArg(eventTime), o.s.timeArg(now)); err != nil {
			return nil, fmt.Errorf("enqueueing into outbox %s: %w", o.table, err)
		}
		ids[i] = id
	}
	if o.s.notify != "" {
		var ignored any
		if err := conn.QueryRow(ctx, o.s.notify, o.channel).Scan(&ignored); err != nil {
			return nil, fmt.Errorf("enqueueing into outbox %s: notifying the relays: %w", o.table, err)
		}
	}
	if o.serialRead {
		// Before the commit: the woken relays' next read waits for it.
		o.wakeAll()
	}
	return ids, nil
}
