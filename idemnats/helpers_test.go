package idemnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// testIDHeader is where the conformance tests put message IDs: the suite
// publishes copies of one ID back to back, which JetStream's publish
// dedupe would drop if the ID were in Nats-Msg-Id.
const testIDHeader = "Idem-Msg-Id"

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9]+`)

// uniqueName is a stream name for t that no other test uses.
func uniqueName(t testing.TB) string {
	n := strings.Trim(unsafeName.ReplaceAllString(t.Name(), "_"), "_")
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "T_" + n + "_" + hex.EncodeToString(b)
}

// connect opens a test connection to url, closed when t ends.
func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// testMaxAge is the MaxAge of the tests' streams: within the inbox's
// window (14 days by default), as Run requires.
const testMaxAge = 24 * time.Hour

// createStreams creates stream name on subject name+".msgs" and its
// dead-letter stream name+"_DLQ" on "idem.dlq."+name, both file-backed,
// keeping messages testMaxAge.
func createStreams(t testing.TB, js jetstream.JetStream, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".msgs"}, Storage: jetstream.FileStorage, MaxAge: testMaxAge}); err != nil {
		t.Fatalf("creating stream %s: %v", name, err)
	}
	createDeadLetterStream(t, js, name)
}

func createDeadLetterStream(t testing.TB, js jetstream.JetStream, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_DLQ", Subjects: []string{"idem.dlq." + name}, Storage: jetstream.FileStorage, MaxAge: testMaxAge}); err != nil {
		t.Fatalf("creating stream %s_DLQ: %v", name, err)
	}
}

// db is a PostgreSQL schema with an inbox and an effects table that has NO
// unique constraint: a message applied twice shows as two rows.
type db struct {
	url  string
	pool *pgxpool.Pool
}

// newDB makes a schema of t's own (dropped when t ends).
func newDB(t testing.TB) *db {
	t.Helper()
	d := openDB(t, pgtest.Schema(t))
	if _, err := d.pool.Exec(context.Background(), `CREATE TABLE effects (key text NOT NULL, attempt int NOT NULL)`); err != nil {
		t.Fatalf("creating effects: %v (%s)", err, pgtest.FixHint)
	}
	return d
}

// openDB opens the schema of url, made by newDB.
func openDB(t testing.TB, url string) *db {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &db{url: url, pool: pool}
}

func write(ctx context.Context, tx pgx.Tx, m idem.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (key, attempt) VALUES ($1, $2)`, m.ID, m.Attempt)
	return err
}

// processor is a processor over d's inbox writing effects, with hooks.
func (d *db) processor(t testing.TB, hooks ...idem.Hook) *idem.Processor[pgx.Tx] {
	t.Helper()
	return d.processorOn(t, d.pool, hooks...)
}

// processorOn is processor on another pool of d's schema.
func (d *db) processorOn(t testing.TB, pool *pgxpool.Pool, hooks ...idem.Hook) *idem.Processor[pgx.Tx] {
	t.Helper()
	return d.processorWith(t, pool, write, hooks...)
}

// processorWith is processorOn with another handler.
func (d *db) processorWith(t testing.TB, pool *pgxpool.Pool, h idem.Handler[pgx.Tx], hooks ...idem.Hook) *idem.Processor[pgx.Tx] {
	t.Helper()
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "billing-invoice",
		Key:      idem.ByMessageID,
		Handler:  h,
		Logger:   quiet,
		Hooks:    hooks,
		Retry:    idem.RetryPolicy{Backoff: idem.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}, WaitUnavailable: 500 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// effects returns the rows of the effects table and their distinct keys.
func (d *db) effects(t testing.TB) (rows, distinct int) {
	t.Helper()
	if err := d.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT key) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// settles records the outcomes each message was settled with.
type settles struct {
	mu  sync.Mutex
	out map[string][]idem.Outcome
}

func (s *settles) OnSettle(_, _ string, _ idem.Disposition, r idem.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		s.out = map[string][]idem.Outcome{}
	}
	s.out[r.MessageID] = append(s.out[r.MessageID], r.Outcome)
}

func (s *settles) count(o idem.Outcome) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, os := range s.out {
		for _, x := range os {
			if x == o {
				n++
			}
		}
	}
	return n
}

// publish publishes n messages to stream's subject with IDs prefix-00...
// in Nats-Msg-Id, the default ID header.
func publish(t testing.TB, js jetstream.JetStream, stream, prefix string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		if _, err := js.Publish(ctx, stream+".msgs", []byte("body of "+ids[i]), jetstream.WithMsgID(ids[i])); err != nil {
			t.Fatalf("publishing %s: %v", ids[i], err)
		}
	}
	return ids
}

// waitFor polls cond until it holds, failing t with what after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// running runs c until the test ends, and returns a stop that cancels Run
// and returns its error.
func running(t testing.TB, c *idemnats.Consumer[pgx.Tx]) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = errors.New("Run did not return within 30s of its cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}
