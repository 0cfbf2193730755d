// Package pooltest runs a test's database pool at a size the test chooses
// (one connection, or one per worker) and stops the test binary, with every
// goroutine's stack, when a connection of that pool has been waited for so
// long while all of them were held that the code must be waiting for
// itself: an operation that asks its pool for a second connection while it
// holds the last one never gets it, and without the watchdog CI would hang
// until go test's own timeout.
package pooltest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stuck is how long a connection may be waited for while every connection
// of a limited pool is held before the watchdog stops the binary. The
// operations under test hold a connection for milliseconds, at most a few
// seconds; this is far longer, for a loaded machine.
const Stuck = 30 * time.Second

// stuck is Stuck, shortened by this package's own test.
var stuck = Stuck

// tick is how often the watchdogs look.
const tick = 250 * time.Millisecond

// OpenPgx opens a pool on url with at most conns connections (0: pgx's
// default size, unwatched), closed when t ends.
func OpenPgx(t testing.TB, url string, conns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	Pgx(t, cfg, conns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Pgx limits cfg to conns connections and watches its acquires; conns 0
// leaves cfg as it is.
func Pgx(t testing.TB, cfg *pgxpool.Config, conns int) {
	t.Helper()
	if conns <= 0 {
		return
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = 0
	w := &acquires{t: t, inner: cfg.ConnConfig.Tracer, pending: map[*int]time.Time{}}
	cfg.ConnConfig.Tracer = w
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go w.watch(stop)
}

// acquires is a pgx tracer that knows the acquires still waiting.
type acquires struct {
	t     testing.TB
	inner pgx.QueryTracer

	mu      sync.Mutex
	pool    *pgxpool.Pool
	pending map[*int]time.Time
}

type acquireKey struct{}

func (w *acquires) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	id := new(int)
	w.mu.Lock()
	w.pool = pool
	w.pending[id] = time.Now()
	w.mu.Unlock()
	return context.WithValue(ctx, acquireKey{}, id)
}

func (w *acquires) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	if id, ok := ctx.Value(acquireKey{}).(*int); ok {
		w.mu.Lock()
		delete(w.pending, id)
		w.mu.Unlock()
	}
}

func (w *acquires) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if w.inner != nil {
		return w.inner.TraceQueryStart(ctx, c, d)
	}
	return ctx
}

func (w *acquires) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	if w.inner != nil {
		w.inner.TraceQueryEnd(ctx, c, d)
	}
}

func (w *acquires) watch(stop <-chan struct{}) {
	tk := time.NewTicker(tick)
	defer tk.Stop()
	full := time.Time{} // since when a wait has been pending on a full pool
	for {
		select {
		case <-stop:
			return
		case <-tk.C:
		}
		w.mu.Lock()
		pool := w.pool
		var oldest time.Time
		for _, at := range w.pending {
			if oldest.IsZero() || at.Before(oldest) {
				oldest = at
			}
		}
		w.mu.Unlock()
		if pool == nil || oldest.IsZero() {
			full = time.Time{}
			continue
		}
		st := pool.Stat()
		if st.AcquiredConns() < st.MaxConns() {
			full = time.Time{}
			continue
		}
		if full.IsZero() {
			full = time.Now()
		}
		if waited := time.Since(later(oldest, full)); waited > stuck {
			die(w.t, fmt.Sprintf("a connection has been waited for %v while all %d of the pool were held", waited.Round(time.Second), st.MaxConns()))
		}
	}
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// SQL limits db to conns open connections and watches its waits; conns 0
// leaves db as it is.
func SQL(t testing.TB, db *sql.DB, conns int) {
	t.Helper()
	if conns <= 0 {
		return
	}
	db.SetMaxOpenConns(conns)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go watchSQL(t, db, stop)
}

// watchSQL tells a wait from database/sql's counters: WaitCount grows when
// a wait begins, WaitDuration when one ends (served or abandoned). A count
// that grew after the last end, with no end since and every connection in
// use, is a wait still pending.
func watchSQL(t testing.TB, db *sql.DB, stop <-chan struct{}) {
	tk := time.NewTicker(tick)
	defer tk.Stop()
	last := db.Stats()
	var pendingSince time.Time
	for {
		select {
		case <-stop:
			return
		case <-tk.C:
		}
		st := db.Stats()
		switch {
		case st.WaitDuration != last.WaitDuration:
			pendingSince = time.Time{}
			if st.WaitCount != last.WaitCount {
				// A wait ended and one began: the new one may be pending.
				pendingSince = time.Now()
			}
		case st.WaitCount != last.WaitCount && pendingSince.IsZero():
			pendingSince = time.Now()
		}
		last = st
		if pendingSince.IsZero() || st.InUse < st.MaxOpenConnections {
			continue
		}
		if waited := time.Since(pendingSince); waited > stuck {
			die(t, fmt.Sprintf("a connection has been waited for %v while all %d of the pool were in use", waited.Round(time.Second), st.MaxOpenConnections))
		}
	}
}

// die stops the binary with every goroutine's stack: the goroutine that
// holds the pool's last connection and waits for another is among them.
// Failing t alone would leave it waiting, and the binary with it.
func die(t testing.TB, what string) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	fmt.Fprintf(os.Stderr, "\n%s: %s: an operation waits for a second connection of the pool it holds one of (one connection per operation, docs/design.md)\n\n%s\n", t.Name(), what, buf)
	os.Exit(2)
}
