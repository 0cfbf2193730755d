package idemtest_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// fakeT records failures instead of reporting them, so the kit's own
// failures can be asserted on. Everything else (Cleanup, TempDir, Context,
// Logf) goes to the real test.
type fakeT struct {
	testing.TB
	mu     sync.Mutex
	msgs   []string
	failed bool
	fatal  bool
}

func (f *fakeT) Helper() {}

func (f *fakeT) record(msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = true
	f.msgs = append(f.msgs, msg)
}

func (f *fakeT) Error(args ...any)                 { f.record(fmt.Sprint(args...)) }
func (f *fakeT) Errorf(format string, args ...any) { f.record(fmt.Sprintf(format, args...)) }
func (f *fakeT) Fail()                             { f.record("Fail called") }

// Fatal and FailNow end the calling goroutine, as the real ones do, so code
// after them must not run.
func (f *fakeT) Fatal(args ...any) { f.Error(args...); f.stop() }
func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	f.stop()
}
func (f *fakeT) FailNow() { f.Fail(); f.stop() }

func (f *fakeT) stop() {
	f.mu.Lock()
	f.fatal = true
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *fakeT) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

func (f *fakeT) output() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.msgs, "\n")
}

// observe runs fn with a fakeT in its own goroutine (Fatal calls
// runtime.Goexit) and returns what it recorded.
func observe(t *testing.T, fn func(tb testing.TB)) *fakeT {
	t.Helper()
	f := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f
}

// mustPass fails t with the fake's messages if fn failed.
func mustPass(t *testing.T, fn func(tb testing.TB)) {
	t.Helper()
	if f := observe(t, fn); f.Failed() {
		t.Fatalf("check failed on a correct consumer:\n%s", f.output())
	}
}

// mustFail fails t unless fn failed with a message containing each of want.
func mustFail(t *testing.T, fn func(tb testing.TB), want ...string) string {
	t.Helper()
	f := observe(t, fn)
	if !f.Failed() {
		t.Fatalf("check passed; want a failure mentioning %q", want)
	}
	out := f.output()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("failure does not mention %q:\n%s", w, out)
		}
	}
	return out
}

// pgSetup returns a Setup building cfg's consumer over a fresh schema that
// holds a migrated inbox and the tables of ddl.
func pgSetup(ddl string, cfg idem.Config[pgx.Tx], snapOpts *idemtest.SnapshotOptions) idemtest.Setup[pgx.Tx] {
	return func(t testing.TB, faults idem.FaultFunc) (*idem.Processor[pgx.Tx], idemtest.Snapshotter) {
		t.Helper()
		ctx := context.Background()
		pool := pgtest.Pool(t)
		store, err := pgxinbox.New(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatalf("creating tables: %v", err)
		}
		c := cfg
		c.Faults = faults
		c.Logger = quiet
		proc, err := idem.NewProcessor(store, &c)
		if err != nil {
			t.Fatal(err)
		}
		return proc, idemtest.Postgres(pool, snapOpts)
	}
}

func execSQL(q string, args ...any) idem.Handler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
		_, err := tx.Exec(ctx, q, args...)
		return err
	}
}

const balancesDDL = `CREATE TABLE balances (account text PRIMARY KEY, balance bigint NOT NULL, updated_at timestamptz);
INSERT INTO balances VALUES ('acc-1', 0, NULL)`

// addToBalance is the classic non-idempotent effect: an increment.
const addToBalance = `UPDATE balances SET balance = balance + 12500, updated_at = clock_timestamp() WHERE account = 'acc-1'`

// quiet keeps the processor's per-outcome log lines out of test output.
var quiet = slog.New(slog.DiscardHandler)

var sample = idem.Message{ID: "evt-1", Source: "billing", Body: []byte(`{"account":"acc-1","amount":12500}`)}
