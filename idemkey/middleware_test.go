package idemkey_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemkey"
	"github.com/idemkit/idem/internal/pgtest"
)

// newStore returns a migrated store in a fresh schema.
func newStore(t *testing.T) (*idemkey.PGStore, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t)
	store, err := idemkey.NewPGStore(pool, &idemkey.PGConfig{Table: "idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return store, pool
}

// charges is a handler that creates one charge per run: 201 with a new ID.
type charges struct {
	runs   atomic.Int64
	status int           // status to answer; 201 when 0
	gate   chan struct{} // when set, the first run waits for it
}

func (c *charges) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.runs.Add(1)
	if c.gate != nil && n == 1 {
		<-c.gate
	}
	body, _ := io.ReadAll(r.Body)
	status := c.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/charges/ch-%d", n))
	w.Header().Set("X-Run", fmt.Sprint(n))
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"id":"ch-%d","request":%q,"bytes":"\x00\xff"}`, n, body)
}

func serve(t *testing.T, store idemkey.Store, cfg *idemkey.Config, h http.Handler) *httptest.Server {
	t.Helper()
	if cfg == nil {
		cfg = &idemkey.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	srv := httptest.NewServer(idemkey.Middleware(store, cfg)(h))
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url, key, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return answer{}
	}
	if key != "" {
		req.Header.Set(idemkey.Header, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

func TestMiddlewareReplaysTheFirstResponse(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	h := &charges{}
	srv := serve(t, store, nil, h)

	first := post(t, srv.URL+"/charges", "renew:sub-8421:2026-03", `{"amount":5000000}`)
	second := post(t, srv.URL+"/charges", "renew:sub-8421:2026-03", `{"amount":5000000}`)
	quoted := post(t, srv.URL+"/charges", `"renew:sub-8421:2026-03"`, `{"amount":5000000}`)
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if first.status != http.StatusCreated || first.header.Get(idemkey.ReplayedHeader) != "" {
		t.Fatalf("first answer: %d, replayed %q", first.status, first.header.Get(idemkey.ReplayedHeader))
	}
	for _, again := range []answer{second, quoted} {
		if again.status != first.status || !bytes.Equal(again.body, first.body) {
			t.Fatalf("replay %d %q, want %d %q", again.status, again.body, first.status, first.body)
		}
		for _, k := range []string{"Content-Type", "Location"} {
			if again.header.Get(k) != first.header.Get(k) {
				t.Errorf("replayed %s = %q, want %q", k, again.header.Get(k), first.header.Get(k))
			}
		}
		if again.header.Get(idemkey.ReplayedHeader) != "true" {
			t.Errorf("replay lacks %s: true", idemkey.ReplayedHeader)
		}
		if again.header.Get("X-Run") != "" {
			t.Error("a header outside Config.Headers was replayed")
		}
	}
	// Another key is another charge.
	if other := post(t, srv.URL+"/charges", "renew:sub-8421:2026-04", `{"amount":5000000}`); other.status != http.StatusCreated || h.runs.Load() != 2 {
		t.Fatalf("another key: %d after %d runs", other.status, h.runs.Load())
	}
}

func TestMiddlewareConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	h := &charges{gate: make(chan struct{})}
	srv := serve(t, store, &idemkey.Config{RetryAfter: 2e9}, h)

	const n = 16
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { answers <- post(t, srv.URL+"/charges", "k-1", "same") })
	}
	// While the winner is held in the handler, every other request is
	// answered 409: wait for those, then let the winner finish.
	for range n - 1 {
		a := <-answers
		if a.status != http.StatusConflict || a.header.Get("Retry-After") != "2" {
			t.Errorf("duplicate in progress: %d, Retry-After %q; want 409, 2", a.status, a.header.Get("Retry-After"))
		}
	}
	close(h.gate)
	wg.Wait()
	won := <-answers
	if won.status != http.StatusCreated {
		t.Fatalf("winner: %d %s", won.status, won.body)
	}
	after := post(t, srv.URL+"/charges", "k-1", "same")
	if after.status != http.StatusCreated || !bytes.Equal(after.body, won.body) || after.header.Get(idemkey.ReplayedHeader) != "true" {
		t.Fatalf("after the winner: %d %q, want a replay of %q", after.status, after.body, won.body)
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
}

func TestMiddlewareRefusesAKeyReusedForAnotherRequest(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	h := &charges{}
	srv := serve(t, store, nil, h)
	post(t, srv.URL+"/charges", "k-1", `{"amount":100}`)
	for _, c := range []struct{ path, body string }{
		{"/charges", `{"amount":999}`},
		{"/refunds", `{"amount":100}`},
		{"/charges?currency=usd", `{"amount":100}`},
	} {
		if a := post(t, srv.URL+c.path, "k-1", c.body); a.status != http.StatusUnprocessableEntity {
			t.Errorf("%s %s with a used key: %d, want 422", c.path, c.body, a.status)
		}
	}
	if runs := h.runs.Load(); runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
}

func TestMiddlewareServerErrorsAreStoredExceptUnavailable(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	// A 500 or a 502 may come after the charge went through: it is stored
	// and replayed, never run again.
	for i, status := range []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout} {
		h := &charges{status: status}
		srv := serve(t, store, nil, h)
		key := fmt.Sprintf("k-%d", i)
		post(t, srv.URL, key, "x")
		h.status = 0
		if a := post(t, srv.URL, key, "x"); a.status != status || a.header.Get(idemkey.ReplayedHeader) != "true" || h.runs.Load() != 1 {
			t.Errorf("retry after %d: %d replayed=%q runs=%d; want the %d replayed, 1 run", status, a.status, a.header.Get(idemkey.ReplayedHeader), h.runs.Load(), status)
		}
	}

	// 503 says the request was not processed: the key is free again.
	h := &charges{status: http.StatusServiceUnavailable}
	srv := serve(t, store, nil, h)
	if a := post(t, srv.URL, "k-503", "x"); a.status != http.StatusServiceUnavailable {
		t.Fatalf("first: %d", a.status)
	}
	h.status = 0
	retry := post(t, srv.URL, "k-503", "x")
	if retry.status != http.StatusCreated || retry.header.Get(idemkey.ReplayedHeader) != "" {
		t.Fatalf("retry after 503: %d replayed=%q, want a fresh 201", retry.status, retry.header.Get(idemkey.ReplayedHeader))
	}
	if again := post(t, srv.URL, "k-503", "x"); !bytes.Equal(again.body, retry.body) || h.runs.Load() != 2 {
		t.Fatalf("after success: runs %d, body %q want %q", h.runs.Load(), again.body, retry.body)
	}

	// A custom policy still releases what it is told to.
	release := &charges{status: http.StatusBadGateway}
	srv = serve(t, store, &idemkey.Config{Release: func(status int) bool { return status >= 500 }}, release)
	post(t, srv.URL, "k-custom", "x")
	release.status = 0
	if a := post(t, srv.URL, "k-custom", "x"); a.status != http.StatusCreated || release.runs.Load() != 2 {
		t.Fatalf("custom Release after 502: %d runs=%d, want a fresh 201", a.status, release.runs.Load())
	}
}

func TestMiddlewarePanicReleasesTheKey(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	var runs atomic.Int64
	handler := idemkey.Middleware(store, &idemkey.Config{Logger: slog.New(slog.DiscardHandler)})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("gateway client crashed")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	call := func() (code int, panicked bool) {
		defer func() {
			if recover() != nil {
				panicked = true
			}
		}()
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("x"))
		req.Header.Set(idemkey.Header, "k-1")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		return w.Code, false
	}
	if _, panicked := call(); !panicked {
		t.Fatal("the handler's panic was swallowed")
	}
	if code, _ := call(); code != http.StatusCreated || runs.Load() != 2 {
		t.Fatalf("retry after a panic: %d after %d runs, want 201 after 2", code, runs.Load())
	}
}

// A handler that panics after it began its response may have done its work:
// the key is settled with a 500, and the handler does not run again.
func TestMiddlewarePanicAfterWritingStoresA500(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	var runs atomic.Int64
	srv := serve(t, store, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ch-1"`)
			panic("crashed mid-response")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the server logs the panic
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set(idemkey.Header, "k-1")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a panicking handler answered %d", resp.StatusCode)
	}
	a := post(t, srv.URL, "k-1", "x")
	if a.status != http.StatusInternalServerError || a.header.Get(idemkey.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Fatalf("retry after a panic mid-response: %d replayed=%q runs=%d; want a replayed 500, 1 run", a.status, a.header.Get(idemkey.ReplayedHeader), runs.Load())
	}
}

func TestMiddlewareScopesKeys(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	h := &charges{}
	srv := serve(t, store, &idemkey.Config{Scope: func(r *http.Request) string { return r.Header.Get("X-Client") }}, h)
	a := post(t, srv.URL, "k-1", "x", "X-Client", "merchant-a")
	b := post(t, srv.URL, "k-1", "x", "X-Client", "merchant-b")
	if a.status != http.StatusCreated || b.status != http.StatusCreated || bytes.Equal(a.body, b.body) || h.runs.Load() != 2 {
		t.Fatalf("two clients with one key: %d %q, %d %q, runs %d", a.status, a.body, b.status, b.body, h.runs.Load())
	}
	if again := post(t, srv.URL, "k-1", "x", "X-Client", "merchant-a"); !bytes.Equal(again.body, a.body) || h.runs.Load() != 2 {
		t.Fatalf("same client again: %q, want replay of %q", again.body, a.body)
	}
}

func TestMiddlewareRequestsWithoutAGuardedKey(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	h := &charges{}
	srv := serve(t, store, nil, h)
	post(t, srv.URL, "", "x")
	post(t, srv.URL, "", "x")
	if h.runs.Load() != 2 {
		t.Fatalf("requests without a key: %d runs, want 2 (pass through)", h.runs.Load())
	}
	for _, key := range []string{"has space", `"unterminated\"`, strings.Repeat("k", idemkey.MaxLen+1)} {
		if a := post(t, srv.URL, key, "x"); a.status != http.StatusBadRequest {
			t.Errorf("key %q: %d, want 400", key, a.status)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set(idemkey.Header, "k-get")
	for range 2 {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if h.runs.Load() != 4 {
		t.Fatalf("GET with a key: %d runs in all, want 4 (GET is not guarded)", h.runs.Load())
	}

	required := serve(t, store, &idemkey.Config{Required: true, MaxBody: 4}, h)
	if a := post(t, required.URL, "", "x"); a.status != http.StatusBadRequest || a.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("required key missing: %d %s", a.status, a.header.Get("Content-Type"))
	}
	if a := post(t, required.URL, "k-big", "12345"); a.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("body over MaxBody: %d, want 413", a.status)
	}
}

func TestMiddlewareStoreDownIsServiceUnavailable(t *testing.T) {
	t.Parallel()
	store, pool := newStore(t)
	pool.Close()
	h := &charges{}
	srv := serve(t, store, nil, h)
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || h.runs.Load() != 0 {
		t.Fatalf("store down: %d, Retry-After %q, runs %d; want 503 with Retry-After and no run", a.status, a.header.Get("Retry-After"), h.runs.Load())
	}
}

func TestMiddlewareConfig(t *testing.T) {
	t.Parallel()
	for name, f := range map[string]func(){
		"nil store":       func() { idemkey.Middleware(nil, nil) },
		"negative lease":  func() { idemkey.Middleware(&idemkey.PGStore{}, &idemkey.Config{Lease: -1}) },
		"lease under 1ms": func() { idemkey.Middleware(&idemkey.PGStore{}, &idemkey.Config{Lease: 500 * time.Microsecond}) },
		"TTL under 1ms":   func() { idemkey.Middleware(&idemkey.PGStore{}, &idemkey.Config{TTL: time.Nanosecond}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
	if _, err := idemkey.NewPGStore(nil, nil); !errors.Is(err, idemkey.ErrConfig) {
		t.Errorf("nil db: %v", err)
	}
}

func TestMiddlewareNilFingerprint(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	h := &charges{}
	srv := serve(t, store, &idemkey.Config{Fingerprint: func(*http.Request, []byte) []byte { return nil }}, h)
	first := post(t, srv.URL, "k-1", "x")
	again := post(t, srv.URL, "k-1", "x")
	if first.status != http.StatusCreated || again.status != http.StatusCreated || again.header.Get(idemkey.ReplayedHeader) != "true" || h.runs.Load() != 1 {
		t.Fatalf("nil fingerprint: %d then %d (replayed %q), runs %d; want 201, a replayed 201, 1 run",
			first.status, again.status, again.header.Get(idemkey.ReplayedHeader), h.runs.Load())
	}
}

func TestMiddlewareReplaysContentEncodingAndDisposition(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	var runs atomic.Int64
	srv := serve(t, store, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/csv")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Disposition", `attachment; filename="receipt.csv"`)
		w.Header().Set("Cache-Control", "no-store")
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, "charge,amount\nch-1,5000000\n")
		_ = zw.Close()
	}))
	// An explicit Accept-Encoding keeps the client from decompressing.
	first := post(t, srv.URL, "k-1", "x", "Accept-Encoding", "gzip")
	again := post(t, srv.URL, "k-1", "x", "Accept-Encoding", "gzip")
	if runs.Load() != 1 || again.header.Get(idemkey.ReplayedHeader) != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("runs %d, replayed %q", runs.Load(), again.header.Get(idemkey.ReplayedHeader))
	}
	for _, k := range []string{"Content-Type", "Content-Encoding", "Content-Disposition", "Cache-Control"} {
		if again.header.Get(k) == "" || again.header.Get(k) != first.header.Get(k) {
			t.Errorf("replayed %s = %q, want %q", k, again.header.Get(k), first.header.Get(k))
		}
	}
	zr, err := gzip.NewReader(bytes.NewReader(again.body))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(zr); err != nil || !strings.HasPrefix(string(b), "charge,amount") {
		t.Fatalf("replayed body: %q, %v", b, err)
	}
}

// logs collects what a test's middleware logs.
type logs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logs) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func TestMiddlewareResponseOverMaxResponse(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	var runs atomic.Int64
	big := strings.Repeat("0123456789abcdef", 256) // 4 KiB
	var log logs
	srv := serve(t, store, &idemkey.Config{MaxResponse: 1024, Logger: log.logger()}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, big[:512]) // buffered
		_, _ = io.WriteString(w, big[512:]) // over the limit
	}))
	first := post(t, srv.URL, "k-1", "x")
	if first.status != http.StatusCreated || string(first.body) != big {
		t.Fatalf("first: %d with %d bytes, want 201 with the whole %d", first.status, len(first.body), len(big))
	}
	// The response could not be kept, but the key is settled: the handler
	// never runs again for it.
	again := post(t, srv.URL, "k-1", "x")
	if again.status != http.StatusInternalServerError || again.header.Get(idemkey.ReplayedHeader) != "true" ||
		!strings.Contains(string(again.body), "too large") || runs.Load() != 1 {
		t.Fatalf("retry: %d replayed=%q %s, runs %d; want a replayed 500 saying the response was too large, 1 run",
			again.status, again.header.Get(idemkey.ReplayedHeader), again.body, runs.Load())
	}
	if !strings.Contains(log.String(), "too large") {
		t.Errorf("nothing logged about the response too large to keep: %q", log.String())
	}
}

// A handler slower than its lease keeps the key: the lease is extended
// while it runs, so a retry meanwhile is a 409, not a second run.
func TestMiddlewareExtendsTheLeaseOfASlowHandler(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	var runs atomic.Int64
	srv := serve(t, store, &idemkey.Config{Lease: 300 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		time.Sleep(time.Second)
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan answer, 1)
	go func() { first <- post(t, srv.URL, "k-1", "x") }()
	time.Sleep(500 * time.Millisecond)
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusConflict {
		t.Errorf("retry past the lease of a running handler: %d, want 409", a.status)
	}
	if a := <-first; a.status != http.StatusCreated {
		t.Fatalf("first: %d", a.status)
	}
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusCreated || a.header.Get(idemkey.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Fatalf("after the handler: %d replayed=%q runs=%d; want a replayed 201, 1 run", a.status, a.header.Get(idemkey.ReplayedHeader), runs.Load())
	}
}

// flakyStore fails the next completeFails calls of Complete, and counts them.
type flakyStore struct {
	idemkey.Store
	completeFails atomic.Int64
	completes     atomic.Int64
}

func (s *flakyStore) Complete(ctx context.Context, c idemkey.Claim, resp idemkey.Response) error {
	s.completes.Add(1)
	if s.completeFails.Add(-1) >= 0 {
		return errors.New("connection reset by peer")
	}
	return s.Store.Complete(ctx, c, resp)
}

func TestMiddlewareRetriesATransientCompleteFailure(t *testing.T) {
	t.Parallel()
	pg, _ := newStore(t)
	store := &flakyStore{Store: pg}
	store.completeFails.Store(2)
	h := &charges{}
	srv := serve(t, store, nil, h)
	first := post(t, srv.URL, "k-1", "x")
	again := post(t, srv.URL, "k-1", "x")
	if first.status != http.StatusCreated || again.status != http.StatusCreated || again.header.Get(idemkey.ReplayedHeader) != "true" || h.runs.Load() != 1 {
		t.Fatalf("after two failed completions: %d then %d replayed=%q, runs %d; want a stored 201 replayed",
			first.status, again.status, again.header.Get(idemkey.ReplayedHeader), h.runs.Load())
	}
	if n := store.completes.Load(); n != 3 {
		t.Fatalf("Complete called %d times, want 3", n)
	}
}

// A client that leaves mid-handler cancels the request's context; the
// response is still stored, and its retry gets the replay.
func TestMiddlewareStoresTheResponseOfAClientThatLeft(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	started := make(chan struct{})
	var runs atomic.Int64
	srv := serve(t, store, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("the request's context was not canceled when the client left")
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ch-1")
	}))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set(idemkey.Header, "k-1")
	left := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		left <- err
	}()
	<-started
	cancel()
	if err := <-left; err == nil {
		t.Fatal("the client got an answer after it left")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		a := post(t, srv.URL, "k-1", "x")
		if a.status == http.StatusConflict && time.Now().Before(deadline) {
			continue // the handler is still finishing
		}
		if a.status != http.StatusCreated || a.header.Get(idemkey.ReplayedHeader) != "true" || string(a.body) != "ch-1" || runs.Load() != 1 {
			t.Fatalf("retry after the client left: %d replayed=%q %q runs=%d; want the stored 201 replayed",
				a.status, a.header.Get(idemkey.ReplayedHeader), a.body, runs.Load())
		}
		return
	}
}

func TestMiddlewareRefusesTwoKeyHeaders(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	h := &charges{}
	srv := serve(t, store, nil, h)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Add(idemkey.Header, "k-1")
	req.Header.Add(idemkey.Header, "k-2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || h.runs.Load() != 0 {
		t.Fatalf("two %s headers: %d after %d runs, want 400 and no run", idemkey.Header, resp.StatusCode, h.runs.Load())
	}
}

// A claim whose key was taken over while its handler ran (too fast for the
// heartbeat to notice) logs the lost lease, does not overwrite the new
// holder's key, and tells its client to retry, so that it gets the new
// holder's response rather than one the key will never replay.
func TestMiddlewareLeaseLostWhileRunning(t *testing.T) {
	t.Parallel()
	pg, pool := newStore(t)
	store := &flakyStore{Store: pg}
	var log logs
	var runs atomic.Int64
	srv := serve(t, store, &idemkey.Config{Logger: log.logger()}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		// Another request takes the key over, as after a stalled server.
		ctx := r.Context()
		if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`); err != nil {
			t.Error(err)
		}
		fp := idemkey.Fingerprint(r, []byte("x"))
		if rec, err := pg.Claim(ctx, idemkey.Claim{Key: "k-1", Fingerprint: fp, Token: "other", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
			t.Errorf("takeover: %+v, %v", rec, err)
		}
		w.Header().Set("Location", "/charges/ch-1")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ch-1")
	}))
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusConflict || a.header.Get("Retry-After") == "" || a.header.Get("Location") != "" {
		t.Fatalf("request that lost its lease: %d %q Location=%q, want 409 with Retry-After and none of the handler's headers", a.status, a.body, a.header.Get("Location"))
	}
	if !strings.Contains(log.String(), idemkey.ErrLeaseLost.Error()) {
		t.Errorf("lost lease not logged: %q", log.String())
	}
	if n := store.completes.Load(); n != 1 {
		t.Errorf("Complete called %d times after a lost lease, want 1 (no retry)", n)
	}
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusConflict || runs.Load() != 1 {
		t.Fatalf("retry while the new holder runs: %d, runs %d; want 409, 1 run", a.status, runs.Load())
	}
}

// A key taken over while its handler runs (its lease lapsed: here another
// transaction expires it, as a stalled server would let it lapse) cancels
// the handler's context with ErrLeaseLost at the next extension. The loser's
// late response is not stored: the request that took the key over owns it,
// and the loser's client is told to retry (409), which replays that response.
func TestMiddlewareCancelsTheHandlerOfAKeyTakenOver(t *testing.T) {
	t.Parallel()
	store, pool := newStore(t)
	started, finish := make(chan struct{}), make(chan struct{})
	cause := make(chan error, 1)
	var runs atomic.Int64
	srv := serve(t, store, &idemkey.Config{Lease: 300 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "ch-2")
			return
		}
		close(started)
		select {
		case <-r.Context().Done():
			cause <- context.Cause(r.Context())
		case <-time.After(3 * time.Second):
			cause <- errors.New("the handler's context was never canceled")
		}
		<-finish // a response the handler sends all the same, too late
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ch-1")
	}))
	first := make(chan answer, 1)
	go func() { first <- post(t, srv.URL, "k-1", "x") }()
	<-started
	defer close(finish)
	if _, err := pool.Exec(context.Background(), `UPDATE idempotency_keys SET expires_at = now() - interval '1 millisecond'`); err != nil {
		t.Fatal(err)
	}
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusCreated || string(a.body) != "ch-2" || a.header.Get(idemkey.ReplayedHeader) != "" {
		t.Fatalf("retry after the lease lapsed: %d %q replayed=%q; want the takeover's own 201 ch-2", a.status, a.body, a.header.Get(idemkey.ReplayedHeader))
	}
	if err := <-cause; !errors.Is(err, idemkey.ErrLeaseLost) {
		t.Fatalf("cause of the taken-over handler's cancellation: %v, want ErrLeaseLost", err)
	}
	finish <- struct{}{}
	if a := <-first; a.status != http.StatusConflict || a.header.Get("Retry-After") == "" || strings.Contains(string(a.body), "ch-1") {
		t.Errorf("client of the taken-over request: %d %q Retry-After=%q; want 409 with Retry-After", a.status, a.body, a.header.Get("Retry-After"))
	}
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusCreated || string(a.body) != "ch-2" || a.header.Get(idemkey.ReplayedHeader) != "true" || runs.Load() != 2 {
		t.Fatalf("after both: %d %q replayed=%q runs=%d; want ch-2 replayed, 2 runs", a.status, a.body, a.header.Get(idemkey.ReplayedHeader), runs.Load())
	}
}

// Two servers share the keys table; the first cannot reach the store (its
// pool's only connection is taken), so its heartbeat cannot extend the
// lease, which lapses for real. A client retry reaches the second server and
// takes the key over. The first handler's context must be canceled, with
// ErrLeaseLost, before the second run starts, and nothing of the first run
// is stored.
func TestMiddlewareCancelsTheHandlerBeforeAnUnextendedLeaseLapses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Schema(t)
	cfgA, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfgA.MaxConns = 1
	poolA, err := pgxpool.NewWithConfig(ctx, cfgA)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(poolA.Close)
	poolB, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(poolB.Close)
	storeA, err := idemkey.NewPGStore(poolA, &idemkey.PGConfig{Table: "idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if err := storeA.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	storeB, err := idemkey.NewPGStore(poolB, &idemkey.PGConfig{Table: "idempotency_keys"})
	if err != nil {
		t.Fatal(err)
	}

	started := make(chan struct{})
	var runs atomic.Int64
	var firstCtx atomic.Value // context.Context of the first run
	secondSaw := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) > 1 {
			secondSaw <- context.Cause(firstCtx.Load().(context.Context))
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "ch-2")
			return
		}
		firstCtx.Store(r.Context())
		close(started)
		select {
		case <-r.Context().Done():
		case <-time.After(3 * time.Second):
		}
		http.Error(w, "canceled", http.StatusInternalServerError) // what a handler told to stop answers
	})
	const lease = 300 * time.Millisecond
	srvA := serve(t, storeA, &idemkey.Config{Lease: lease}, h)
	srvB := serve(t, storeB, &idemkey.Config{Lease: lease}, h)

	first := make(chan answer, 1)
	go func() { first <- post(t, srvA.URL, "k-1", "x") }()
	<-started
	conn, err := poolA.Acquire(ctx) // server A can no longer reach the store
	if err != nil {
		t.Fatal(err)
	}
	var retry answer
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		retry = post(t, srvB.URL, "k-1", "x")
		if retry.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
	}
	conn.Release()
	if retry.status != http.StatusCreated || string(retry.body) != "ch-2" {
		t.Fatalf("retry on server B after the lease lapsed: %d %q; want the takeover's 201 ch-2", retry.status, retry.body)
	}
	if err := <-secondSaw; !errors.Is(err, idemkey.ErrLeaseLost) {
		t.Errorf("when the second run started, the first run's context had cause %v; want it canceled with ErrLeaseLost", err)
	}
	if a := <-first; a.status != http.StatusConflict {
		t.Errorf("client of the request that lost its lease: %d %q; want 409", a.status, a.body)
	}
	if a := post(t, srvA.URL, "k-1", "x"); a.status != http.StatusCreated || string(a.body) != "ch-2" || a.header.Get(idemkey.ReplayedHeader) != "true" || runs.Load() != 2 {
		t.Fatalf("after both: %d %q replayed=%q runs=%d; want ch-2 replayed, 2 runs", a.status, a.body, a.header.Get(idemkey.ReplayedHeader), runs.Load())
	}
}

func TestMiddlewareRequestKey(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t)
	got := make(chan string, 1)
	srv := serve(t, store, &idemkey.Config{Scope: func(r *http.Request) string { return r.Header.Get("X-Client") }},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			scope, key, ok := idemkey.RequestKey(r.Context())
			got <- fmt.Sprint(scope, " ", key, " ", ok, " ", idemkey.Derive("charge", scope, key))
		}))
	post(t, srv.URL, `"k:1"`, "x", "X-Client", "merchant-a")
	if want, got := "merchant-a k:1 true charge:merchant-a:k%3A1", <-got; got != want {
		t.Fatalf("RequestKey in the handler: %q, want %q", got, want)
	}
	if _, _, ok := idemkey.RequestKey(context.Background()); ok {
		t.Fatal("RequestKey outside the middleware reported a key")
	}
}

// A handler that panics after its lease was lost leaves the key to the
// request that took it over: no 500 is stored in place of its response.
func TestMiddlewarePanicAfterALostLeaseStoresNothing(t *testing.T) {
	t.Parallel()
	store, pool := newStore(t)
	started, canceled := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	srv := serve(t, store, &idemkey.Config{Lease: 300 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "ch-2")
			return
		}
		close(started)
		select {
		case <-r.Context().Done():
			close(canceled)
		case <-time.After(3 * time.Second):
		}
		w.WriteHeader(http.StatusCreated) // it began its response, then failed
		panic("charge failed")
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the server logs the panic
	first := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header.Set(idemkey.Header, "k-1")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			first <- answer{status: resp.StatusCode}
			return
		}
		first <- answer{}
	}()
	<-started
	if _, err := pool.Exec(context.Background(), `UPDATE idempotency_keys SET expires_at = now() - interval '1 millisecond'`); err != nil {
		t.Fatal(err)
	}
	// The retry runs while the first is still running (the lease was made
	// to lapse behind the heartbeat's back): it takes the key and stores.
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusCreated || string(a.body) != "ch-2" {
		t.Fatalf("takeover: %d %q", a.status, a.body)
	}
	select {
	case <-canceled:
	case <-time.After(3 * time.Second):
		t.Fatal("the taken-over handler was not canceled")
	}
	if a := <-first; a.status != 0 {
		t.Errorf("a panicking handler answered %d", a.status)
	}
	if a := post(t, srv.URL, "k-1", "x"); a.status != http.StatusCreated || string(a.body) != "ch-2" || a.header.Get(idemkey.ReplayedHeader) != "true" || runs.Load() != 2 {
		t.Fatalf("after the panic: %d %q replayed=%q runs=%d; want ch-2 replayed", a.status, a.body, a.header.Get(idemkey.ReplayedHeader), runs.Load())
	}
}
