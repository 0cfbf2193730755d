package outbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// pubLog is what the test publishers of one test were handed, in the order
// their Publish calls confirmed it, across relays.
type pubLog struct {
	mu    sync.Mutex
	got   []Record
	by    map[string]string // record ID → name of the publisher that confirmed it first
	dups  []string          // IDs confirmed more than once
	calls int
}

func newLog() *pubLog { return &pubLog{by: map[string]string{}} }

func (l *pubLog) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.got))
	for i, r := range l.got {
		out[i] = r.ID
	}
	return out
}

func (l *pubLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.got)
}

// testPublisher is a Publisher that confirms what it is handed into a
// pubLog. fate, when set, decides each record: nil confirms, anything else
// is that record's error (Refused for the broker refusing it, a plain error
// for an unreachable broker). hold, when set, is called at the start of
// every Publish and may block, as a relay stuck on a broker that stopped
// answering does (it ignores the context on purpose).
type testPublisher struct {
	name string
	log  *pubLog
	fate func(Record) error
	hold func(call int)

	mu       sync.Mutex
	calls    int
	attempts map[string]int
}

func (p *testPublisher) Publish(ctx context.Context, recs []Record) []error {
	p.mu.Lock()
	p.calls++
	call := p.calls
	if p.attempts == nil {
		p.attempts = map[string]int{}
	}
	p.mu.Unlock()
	if p.hold != nil {
		p.hold(call)
	}
	errs := make([]error, len(recs))
	failed := map[string]bool{}
	var ok []Record
	for i, r := range recs {
		if failed[r.Key] && r.Key != "" {
			errs[i] = ErrNotAttempted
			continue
		}
		p.mu.Lock()
		p.attempts[r.ID]++
		p.mu.Unlock()
		if p.fate != nil {
			errs[i] = p.fate(r)
		}
		if errs[i] != nil {
			failed[r.Key] = true
			continue
		}
		ok = append(ok, r)
	}
	p.log.mu.Lock()
	p.log.calls++
	for _, r := range ok {
		if _, seen := p.log.by[r.ID]; seen {
			p.log.dups = append(p.log.dups, r.ID)
		} else {
			p.log.by[r.ID] = p.name
		}
		p.log.got = append(p.log.got, r)
	}
	p.log.mu.Unlock()
	return errs
}

func (p *testPublisher) Close() error { return nil }

func (p *testPublisher) attemptsOf(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attempts[id]
}

func (p *testPublisher) callCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// eventually waits for cond, failing the test with what after a generous
// minute: a liveness bound for a loaded machine, not a speed assertion.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runRelay runs r until the test ends (or stop is called) and fails the
// test when Run returns an error.
func runRelay(t *testing.T, r *Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// pgxOutbox is a migrated outbox on a fresh PostgreSQL schema through a
// pgx pool.
func pgxOutbox(t *testing.T, cfg *Config) (*Outbox[pgx.Tx], *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t)
	o, err := NewPgx(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return o, pool
}

// sqlOutbox is a migrated outbox through database/sql: on PostgreSQL
// (pgx stdlib) or on SQLite in a temporary directory.
func sqlOutbox(t testing.TB, dialect sqlinbox.Dialect, cfg *Config) (*Outbox[*sql.Tx], *sql.DB) {
	t.Helper()
	var db *sql.DB
	var err error
	if dialect == sqlinbox.SQLite {
		db, err = sqliteinbox.Open(filepath.Join(t.TempDir(), "outbox.db"))
	} else {
		db, err = sql.Open("pgx", pgtest.Schema(t))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	o, err := NewSQL(db, dialect, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return o, db
}

// enqueueSQL enqueues msgs in a transaction of db and commits it (or,
// with rollback, rolls it back).
func enqueueSQL(t *testing.T, o *Outbox[*sql.Tx], db *sql.DB, rollback bool, msgs ...Message) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := o.Enqueue(ctx, tx, msgs...)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if rollback {
		err = tx.Rollback()
	} else {
		err = tx.Commit()
	}
	if err != nil && !errors.Is(err, sql.ErrTxDone) {
		t.Fatal(err)
	}
	return ids
}

// enqueuePgx is enqueueSQL through a pgx pool.
func enqueuePgx(t *testing.T, o *Outbox[pgx.Tx], pool *pgxpool.Pool, rollback bool, msgs ...Message) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ids, err := o.Enqueue(ctx, tx, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if !rollback {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// newTestRelay is NewRelay on an outbox's core, for tests written once
// for every transaction type.
func newTestRelay(c *core, pub Publisher, cfg *RelayConfig) (*Relay, error) {
	return NewRelay(&Outbox[struct{}]{core: c}, pub, cfg)
}

func mustUUIDTime(t *testing.T, id string) time.Time {
	t.Helper()
	at, ok := idem.TimeFromUUIDv7(id)
	if !ok {
		t.Fatalf("%s is not a UUIDv7", id)
	}
	return at
}

// TestMain keeps the relays' warnings about the outages the tests cause
// out of the output.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(m.Run())
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
