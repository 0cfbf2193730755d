package idembroker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

type healthOf struct{ s *idembroker.HealthState }

func (h healthOf) Health() idembroker.Health { return h.s.Health() }

// /readyz of a consumer holding for an outage says the error once: not
// again as the consumer's hold reason and last error. A driver's
// multi-line error is one line there.
func TestReadyzSaysEachErrorOnce(t *testing.T) {
	now := time.Now()
	s := idembroker.NewHealthState("ledger", "credits")
	s.Start(now)
	s.Connect(now)
	cause := errors.Join(errors.New("failed to connect to `user=app database=ledger`:"), errors.New("\t127.0.0.1:5432 (localhost): dial error: connection refused"))
	r := idem.Result{MessageID: "m1", Outcome: idem.Retry, Blameless: true, Err: fmt.Errorf("for 1m0s: %w: %w", idem.ErrUnavailable, cause)}
	s.Settle(dispose(r), r, now)
	rec := httptest.NewRecorder()
	idembroker.ReadyHandler(healthOf{s}).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	body := rec.Body.String()
	if n := strings.Count(body, "connection refused"); n != 1 {
		t.Errorf("/readyz says the error %d times, want once:\n%s", n, body)
	}
	var b struct{ Errors []string }
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || len(b.Errors) != 1 || strings.Contains(b.Errors[0], "\n") {
		t.Errorf("/readyz errors %q (%v): want one, on one line", b.Errors, err)
	}
}

// The end of an outage is logged, with how long it lasted and how many
// messages were held; durations are text, not nanoseconds.
func TestOutageEndIsLogged(t *testing.T) {
	var buf bytes.Buffer
	now := time.Now()
	s := idembroker.NewHealthState("ledger", "credits")
	s.LogTo(slog.New(slog.NewJSONHandler(&buf, nil)))
	s.Start(now)
	s.Connect(now)
	for _, id := range []string{"m1", "m2", "m1"} {
		r := outageResult()
		r.MessageID = id
		s.Settle(dispose(r), r, now)
	}
	ack := idem.Result{MessageID: "m1", Outcome: idem.Applied}
	s.Settle(dispose(ack), ack, now.Add(12*time.Second))
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("log %q: %v", buf.String(), err)
	}
	if msg, _ := rec["msg"].(string); !strings.HasPrefix(msg, "database back after 12s, 2 held messages") || rec["outage"] != "12s" || rec["held_messages"] != 2.0 {
		t.Errorf("log line %s: want the outage's end, 12s, 2 held messages", buf.String())
	}
}

// A processor's log lines give durations as text and errors on one line,
// and so does the disposition's reason, whatever handler the application
// gave.
func TestProcessorLogsOneLineErrors(t *testing.T) {
	ctx := context.Background()
	var buf syncBuf
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, Logger: slog.New(slog.NewJSONHandler(&buf, nil)),
		Handler: func(context.Context, pgx.Tx, idem.Message) error {
			return idem.Permanent(errors.Join(errors.New("ERROR: value too long"), errors.New("DETAIL: key (k)=(x) is 9000 bytes"), errors.New("HINT: shorten it")))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Process(ctx, idem.Message{ID: "m1", Body: []byte("x"), Time: time.Now()})
	if r.Outcome != idem.DeadLettered {
		t.Fatalf("outcome %v", r.Outcome)
	}
	if d := p.Dispose(r); strings.Contains(d.Reason, "\n") {
		t.Errorf("reason %q is not one line", d.Reason)
	}
	logs := buf.String()
	if strings.Contains(logs, `\n`) || !strings.Contains(logs, "value too long; DETAIL") {
		t.Errorf("log %s: want the error's lines joined on one line", logs)
	}
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if w, ok := rec["window"]; ok {
			if _, text := w.(string); !text {
				t.Errorf("window logged as %v (%T), want text such as 720h0m0s", w, w)
			}
		}
	}
}

// syncBuf is a log destination safe for concurrent writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
