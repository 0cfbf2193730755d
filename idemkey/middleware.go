package idemkey

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ReplayedHeader is set to "true" on a response replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

// Config configures [Middleware]. A nil *Config means every default.
type Config struct {
	// Methods are the request methods the middleware guards; other methods
	// pass through untouched, with or without a key. Defaults to POST and
	// PATCH, the methods that are not idempotent by definition.
	Methods []string
	// Required answers a guarded request without the header with 400 Bad
	// Request. Defaults to false: such a request passes through unguarded.
	Required bool
	// Scope returns the namespace of a request's keys, typically the
	// authenticated client, so that two clients choosing the same key never
	// see each other's responses. Defaults to one namespace for everyone.
	Scope func(*http.Request) string
	// Fingerprint identifies a request, so that a key reused for another
	// request is refused with 422. Defaults to [Fingerprint] (method, path
	// and query, SHA-256 of the body). A nil result counts as empty.
	Fingerprint func(r *http.Request, body []byte) []byte
	// Headers are the response headers stored and replayed with the status
	// and body; a replay carries no other header of the original response.
	// Defaults to Content-Type, Content-Encoding, Content-Language,
	// Content-Disposition, Location, Cache-Control, ETag and Last-Modified.
	// A header that describes the body (Content-Encoding above all) must be
	// listed, or the replayed body cannot be read. A response negotiated on
	// a request header the fingerprint ignores (Accept-Encoding, say) is
	// replayed as first negotiated.
	Headers []string
	// Release reports whether a response with this status frees the key
	// instead of being stored, so that a retry with the same key runs the
	// handler again. Defaults to status == 503 (Service Unavailable), the
	// status that says the request was not processed; every other status,
	// 5xx included, is stored and replayed, as Stripe does. Widen it with
	// care: a handler that charged a card and then failed (a 500, or a 502
	// or 504 from a call after the charge) is run, and charges, again on a
	// retry when its status is released.
	Release func(status int) bool
	// TTL is how long a stored response is replayed; after it the key is
	// free again. Defaults to 24 hours.
	TTL time.Duration
	// Lease is how long a request in progress holds its key without news
	// of it. While the handler runs, its lease is extended every Lease/3,
	// so a slow handler keeps its key; a server that died mid-request stops
	// extending it, and the next request with the key after the lease runs
	// out takes it over. A handler that never returns keeps its key until
	// its server stops.
	//
	// When the lease cannot be extended (the store unreachable or too slow
	// for nine tenths of Lease, or the key already taken over after a
	// stall), the handler's context is canceled, its context.Cause wrapping
	// [ErrLeaseLost], a tenth of the lease (by this server's clock) before
	// the store lets another request take the key; what the handler answers
	// then is not stored, and its client gets 409 with Retry-After. See
	// [Middleware] for what a canceled handler may already have done.
	// Defaults to 1 minute.
	Lease time.Duration
	// RetryAfter is sent, in whole seconds (at least 1), with the 409
	// answered to a repeat of a request still in progress. Defaults to 1
	// second.
	RetryAfter time.Duration
	// MaxBody is the largest request body, in bytes, read for the
	// fingerprint; a larger body is answered with 413. Defaults to 1 MiB.
	MaxBody int64
	// MaxResponse is the largest response body, in bytes, buffered and
	// stored for replay. A handler that writes more is not cut short: the
	// client gets its response, streamed past the limit, but the key stores
	// a 500 problem saying the response was too large to keep, so that the
	// handler is not run again for it; the event is logged. Defaults to
	// 1 MiB.
	MaxResponse int64
	// Logger receives the store failures: a failed claim (answered with
	// 503) and the failures after the handler ran (the response is still
	// sent). Storing the response is tried four times over about 600ms; when
	// every attempt fails, the key stays in progress until its lease runs
	// out, and a retry after that runs the handler again. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Fingerprint is the default request fingerprint: SHA-256 over the method,
// the request URI (path and query) and the SHA-256 of the body.
func Fingerprint(r *http.Request, body []byte) []byte {
	bodySum := sha256.Sum256(body)
	h := sha256.New()
	h.Write([]byte(r.Method))
	h.Write([]byte{0})
	h.Write([]byte(r.URL.RequestURI()))
	h.Write([]byte{0})
	h.Write(bodySum[:])
	return h.Sum(nil)
}

// middleware is a [Config] with its defaults applied.
type middleware struct {
	store      Store
	methods    []string
	required   bool
	scope      func(*http.Request) string
	print      func(*http.Request, []byte) []byte
	headers    []string
	release    func(int) bool
	ttl, lease time.Duration
	retryAfter string
	maxBody    int64
	maxResp    int64
	log        *slog.Logger
}

// Middleware makes the handlers it wraps honour the [Header], following the
// IETF httpapi Idempotency-Key draft:
//
//   - The first request with a key claims it in store, runs the handler
//     while buffering its response, stores the status, the configured
//     headers and the body, then sends the response.
//   - A repeat with the same key and the same fingerprint gets the stored
//     response again: the same status and body, byte for byte, and the
//     headers listed in Config.Headers (no others), with [ReplayedHeader]:
//     true; the handler does not run.
//   - The same key with another fingerprint: 422 Unprocessable Content.
//   - A repeat while the first request is in progress: 409 Conflict with
//     Retry-After.
//   - A response the Release policy rejects (503 by default), a handler
//     that panics before it writes anything, and a request whose key cannot
//     be claimed leave the key free, so the client may retry. Other 5xx are
//     stored and replayed like any response. A handler that panics after it
//     began writing may have done its work: a 500 is stored for the key,
//     then the panic goes on.
//   - A store that cannot be reached: 503 with Retry-After; the request is
//     not run unguarded.
//   - A response that cannot be stored (Store.Complete failing four times
//     over about 600ms) is still sent, but the key stays in progress until
//     its lease runs out: a retry after that runs the handler again.
//   - A lease that cannot be extended while the handler runs (see
//     Config.Lease) cancels the handler's context, with a cause wrapping
//     [ErrLeaseLost], before another request can take the key over. The
//     canceled request stores nothing and releases nothing; its client gets
//     409 with Retry-After, and its retry gets the response of the request
//     that took the key, or runs the handler afresh. A Complete refused with
//     ErrLeaseLost (the key taken over) is answered the same way. The client thus sees one
//     response per key, but the handler may have run twice: cancellation
//     cannot take back what it did before it saw its context done (a call
//     already sent, a transaction already committed), nor what a handler
//     that ignores its context goes on to do. Make those effects idempotent
//     themselves: give each downstream call a key derived from the request's
//     ([RequestKey], then [Derive]) or from the business action ([Derive],
//     [ForMessage]), so that the second run sends the same key and the API
//     answers with the first call's result; guard writes to your own
//     database with a unique key.
//
// Keys are accepted bare (Stripe's form) or as the draft's quoted
// structured-field string, and must pass [Validate] (400 otherwise). The
// handler's response is buffered, up to Config.MaxResponse, so streaming
// handlers do not fit behind it. Middleware panics on a nil store, a
// negative Config duration or size, or a TTL or Lease under a millisecond,
// at construction, like http.Handle does with bad patterns.
func Middleware(store Store, cfg *Config) func(http.Handler) http.Handler {
	m, err := newMiddleware(store, cfg)
	if err != nil {
		panic("idemkey: " + err.Error())
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(next, w, r) })
	}
}

func newMiddleware(store Store, cfg *Config) (*middleware, error) {
	if store == nil {
		return nil, errors.New("middleware needs a store")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.TTL < 0 || cfg.Lease < 0 || cfg.RetryAfter < 0 || cfg.MaxBody < 0 || cfg.MaxResponse < 0 {
		return nil, fmt.Errorf("negative TTL %v, Lease %v, RetryAfter %v, MaxBody %d or MaxResponse %d",
			cfg.TTL, cfg.Lease, cfg.RetryAfter, cfg.MaxBody, cfg.MaxResponse)
	}
	if (cfg.TTL > 0 && cfg.TTL < time.Millisecond) || (cfg.Lease > 0 && cfg.Lease < time.Millisecond) {
		return nil, fmt.Errorf("TTL %v or Lease %v under the store's 1ms resolution", cfg.TTL, cfg.Lease)
	}
	m := &middleware{
		store: store, methods: cfg.Methods, required: cfg.Required, scope: cfg.Scope,
		print: cfg.Fingerprint, headers: cfg.Headers, release: cfg.Release,
		ttl: cfg.TTL, lease: cfg.Lease, maxBody: cfg.MaxBody, maxResp: cfg.MaxResponse, log: cfg.Logger,
	}
	if m.methods == nil {
		m.methods = []string{http.MethodPost, http.MethodPatch}
	}
	if m.scope == nil {
		m.scope = func(*http.Request) string { return "" }
	}
	if m.print == nil {
		m.print = Fingerprint
	}
	if m.headers == nil {
		m.headers = []string{"Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition",
			"Location", "Cache-Control", "ETag", "Last-Modified"}
	}
	if m.release == nil {
		m.release = func(status int) bool { return status == http.StatusServiceUnavailable }
	}
	if m.ttl == 0 {
		m.ttl = 24 * time.Hour
	}
	if m.lease == 0 {
		m.lease = time.Minute
	}
	retryAfter := cfg.RetryAfter
	if retryAfter == 0 {
		retryAfter = time.Second
	}
	m.retryAfter = strconv.Itoa(max(1, int((retryAfter+time.Second-1)/time.Second)))
	if m.maxBody == 0 {
		m.maxBody = 1 << 20
	}
	if m.maxResp == 0 {
		m.maxResp = 1 << 20
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	return m, nil
}

func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(m.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(Header)
	if len(values) == 0 {
		if m.required {
			problem(w, http.StatusBadRequest, "Idempotency-Key is missing", "This operation requires an "+Header+" header.")
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	key, err := parseKey(values)
	if err != nil {
		problem(w, http.StatusBadRequest, "Idempotency-Key is invalid", err.Error())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.maxBody+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "Request body could not be read", err.Error())
		return
	}
	if int64(len(body)) > m.maxBody {
		problem(w, http.StatusRequestEntityTooLarge, "Request body too large", fmt.Sprintf("An idempotent request body may have at most %d bytes.", m.maxBody))
		return
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))

	fp := m.print(r, body)
	if fp == nil {
		fp = []byte{} // a custom Fingerprint may return nil; the store keeps bytes
	}
	c := Claim{Scope: m.scope(r), Key: key, Fingerprint: fp, Token: newToken(), Lease: m.lease, TTL: m.ttl}
	claimed := time.Now() // the store starts the lease later than this
	rec, err := m.store.Claim(r.Context(), c)
	switch {
	case err != nil:
		m.log.ErrorContext(r.Context(), "idemkey: claiming key", "key", key, "err", err)
		w.Header().Set("Retry-After", m.retryAfter)
		problem(w, http.StatusServiceUnavailable, "Idempotency-Key store unavailable", "The request was not processed; retry it with the same key.")
		return
	case rec == nil:
		m.run(next, w, r, c, claimed)
	case !bytes.Equal(rec.Fingerprint, c.Fingerprint):
		problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused", "This key was used for a different request.")
	case rec.Response == nil:
		w.Header().Set("Retry-After", m.retryAfter)
		problem(w, http.StatusConflict, "Request in progress", "A request with this key is still being processed; retry later.")
	default:
		replay(w, rec.Response)
	}
}

// run serves the request that claimed the key at claimed (the moment the
// claim was sent) and stores or releases it.
func (m *middleware) run(next http.Handler, w http.ResponseWriter, r *http.Request, c Claim, claimed time.Time) {
	ctx := context.WithoutCancel(r.Context()) // the verdict must be stored even if the client left
	hctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	r = r.WithContext(context.WithValue(hctx, requestKey{}, [2]string{c.Scope, c.Key}))
	settled := false
	before := w.Header().Clone() // what the client gets instead, should the lease be lost
	rec := &recorder{w: w, header: w.Header(), max: m.maxResp}
	stop := m.heartbeat(ctx, c, claimed, cancel) // the handler keeps its key while it runs
	defer func() {
		if settled {
			return
		}
		// The handler panicked; let the panic go on. After a lost lease the
		// key is another request's: leave it alone. A handler that wrote
		// nothing is taken to have done nothing: free the key. One that
		// began its response may have done its work: settle the key.
		if lost := stop(); lost != nil {
			m.log.ErrorContext(ctx, "idemkey: handler panicked after its lease was lost; nothing stored", "key", c.Key, "err", lost)
			return
		}
		if rec.status == 0 {
			if err := m.store.Release(ctx, c); err != nil {
				m.log.ErrorContext(ctx, "idemkey: releasing key after panic", "key", c.Key, "err", err)
			}
			return
		}
		resp := problemResponse(http.StatusInternalServerError, "Internal Server Error",
			"The request failed while its response was being written; it is not run again with this key.")
		if err := m.complete(ctx, c, resp); err != nil {
			m.log.ErrorContext(ctx, "idemkey: storing 500 after panic", "key", c.Key, "err", err)
		}
	}()
	next.ServeHTTP(rec, r)
	lost := stop()
	settled = true
	status := rec.statusCode()
	switch {
	case lost != nil:
		// The handler was canceled; whatever it answered is not the key's
		// response. Nothing is stored or released: the key lapsed, and may
		// be held by the request that took it over.
		m.log.ErrorContext(ctx, "idemkey: lease lost while the handler ran; response not stored", "key", c.Key, "status", status, "err", lost)
	case m.release(status):
		if err := m.store.Release(ctx, c); err != nil {
			m.log.ErrorContext(ctx, "idemkey: releasing key", "key", c.Key, "status", status, "err", err)
		}
	case rec.streamed:
		m.log.ErrorContext(ctx, "idemkey: response too large to keep; storing a 500 in its place", "key", c.Key, "status", status, "max", m.maxResp)
		resp := problemResponse(http.StatusInternalServerError, "Response too large to keep",
			fmt.Sprintf("The request was processed, but its response exceeded %d bytes and was not kept for replay; it is not run again with this key.", m.maxResp))
		if err := m.complete(ctx, c, resp); err != nil {
			m.log.ErrorContext(ctx, "idemkey: storing response", "key", c.Key, "status", status, "err", err)
		}
	default:
		resp := Response{Status: status, Header: http.Header{}, Body: rec.body.Bytes()}
		for _, h := range m.headers {
			if v := rec.header.Values(h); len(v) > 0 {
				resp.Header[http.CanonicalHeaderKey(h)] = slices.Clone(v)
			}
		}
		if err := m.complete(ctx, c, resp); err != nil {
			m.log.ErrorContext(ctx, "idemkey: storing response", "key", c.Key, "status", status, "err", err)
			if errors.Is(err, ErrLeaseLost) {
				lost = err
			}
		}
	}
	if rec.streamed {
		return // the response is on its way already
	}
	if lost != nil {
		// Another request holds the key, or may: the client retries and
		// gets the one response kept for it.
		clear(w.Header())
		maps.Copy(w.Header(), before)
		w.Header().Set("Retry-After", m.retryAfter)
		problem(w, http.StatusConflict, "Idempotency-Key lease lost",
			"The lease of this request on its key ran out while it ran; its response was not kept, and another request with this key may have run. Retry with the same key to get the response kept for it.")
		return
	}
	w.WriteHeader(status)
	_, _ = w.Write(rec.body.Bytes())
}

// requestKey is the context key of the claimed scope and key ([RequestKey]).
type requestKey struct{}

// RequestKey returns the scope and the idempotency key of the request
// [Middleware] runs a handler for, from the request's context, and whether
// there is one. A handler derives the keys of its own downstream calls from
// them, Derive("charge", scope, key) for instance, so that a run repeated
// after a lost lease sends the same keys and the APIs it calls answer with
// their first result instead of acting twice.
func RequestKey(ctx context.Context) (scope, key string, ok bool) {
	v, ok := ctx.Value(requestKey{}).([2]string)
	return v[0], v[1], ok
}

// completeBackoff is the pause before each retry of a failed Complete.
var completeBackoff = []time.Duration{50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond}

// complete stores resp for c, retrying a failure other than [ErrLeaseLost]
// after each pause of completeBackoff. ctx must not be canceled with the
// request. When every attempt fails the key stays in progress until its
// lease runs out, and a retry after that runs the handler again.
func (m *middleware) complete(ctx context.Context, c Claim, resp Response) error {
	for i := 0; ; i++ {
		err := m.store.Complete(ctx, c, resp)
		if err == nil || errors.Is(err, ErrLeaseLost) || i == len(completeBackoff) {
			return err
		}
		m.log.WarnContext(ctx, "idemkey: storing response failed; retrying", "key", c.Key, "attempt", i+1, "err", err)
		time.Sleep(completeBackoff[i])
	}
}

// heartbeat extends the lease of c, claimed at the moment sent, every
// c.Lease/3 until the returned stop is called; stop waits for an extension
// under way, so that none follows the verdict, and returns why the lease was
// lost, or nil.
//
// The lease is lost when the store answers [ErrLeaseLost] (the key was taken
// over), or when it has not been extended for nine tenths of c.Lease, counted
// from the moment the last successful extension (or the claim) was sent: the
// store measures the lease from a later moment, so this gives up a tenth of
// the lease before the store lets another request take the key. Either way
// lose is called with the cause, which cancels the handler's context, and
// the heartbeat ends.
func (m *middleware) heartbeat(ctx context.Context, c Claim, sent time.Time, lose context.CancelCauseFunc) (stop func() error) {
	hold := c.Lease - c.Lease/10
	done, exited := make(chan struct{}), make(chan struct{})
	var lost error
	go func() {
		defer close(exited)
		deadline := sent.Add(hold)
		expire := time.NewTimer(time.Until(deadline))
		defer expire.Stop()
		tick := time.NewTicker(c.Lease / 3)
		defer tick.Stop()
		var last error // the last failed extension
		for {
			select {
			case <-done:
				return
			case <-expire.C:
			case <-tick.C:
			}
			select {
			case <-done:
				return // the handler returned first: its verdict goes to the store
			default:
			}
			if !time.Now().Before(deadline) {
				lost = fmt.Errorf("%w: lease of %v not extended in time", ErrLeaseLost, c.Lease)
				if last != nil {
					lost = fmt.Errorf("%w (last attempt: %v)", lost, last)
				}
				break
			}
			at := time.Now()
			ectx, cancel := context.WithDeadline(ctx, deadline)
			err := m.store.Extend(ectx, c)
			cancel()
			if errors.Is(err, ErrLeaseLost) {
				lost = err
				break
			}
			if err != nil {
				last = err
				m.log.WarnContext(ctx, "idemkey: extending lease", "key", c.Key, "err", err)
				continue
			}
			deadline = at.Add(hold)
			expire.Reset(time.Until(deadline))
		}
		m.log.ErrorContext(ctx, "idemkey: lease lost while the handler runs; canceling it", "key", c.Key, "err", lost)
		lose(lost)
	}()
	var once sync.Once
	return func() error {
		once.Do(func() {
			close(done)
			<-exited
		})
		return lost
	}
}

func replay(w http.ResponseWriter, resp *Response) {
	for k, v := range resp.Header {
		w.Header()[k] = slices.Clone(v)
	}
	w.Header().Set(ReplayedHeader, "true")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// parseKey reads the one header value, bare or as a structured-field string.
func parseKey(values []string) (string, error) {
	if len(values) != 1 {
		return "", fmt.Errorf("%w: %d %s headers, want one", ErrInvalidKey, len(values), Header)
	}
	v := strings.TrimSpace(values[0])
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		inner := v[1 : len(v)-1]
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			if c == '\\' {
				if i+1 == len(inner) || (inner[i+1] != '"' && inner[i+1] != '\\') {
					return "", fmt.Errorf("%w: bad escape in quoted key", ErrInvalidKey)
				}
				i++
				c = inner[i]
			} else if c == '"' {
				return "", fmt.Errorf("%w: unescaped quote in quoted key", ErrInvalidKey)
			}
			b.WriteByte(c)
		}
		v = b.String()
	}
	if err := Validate(v); err != nil {
		return "", err
	}
	return v, nil
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// problem writes an RFC 9457 problem, the error format the draft suggests.
func problem(w http.ResponseWriter, status int, title, detail string) {
	resp := problemResponse(status, title, detail)
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(status)
	_, _ = w.Write(resp.Body)
}

// problemResponse is an RFC 9457 problem as a Response to store.
func problemResponse(status int, title, detail string) Response {
	body, _ := json.Marshal(map[string]any{"title": title, "status": status, "detail": detail})
	return Response{Status: status, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: body}
}

// recorder buffers a handler's response, up to max bytes of body; past
// that it sends what it holds and streams the rest to w. Its header map is
// the real response's, so headers the handler sets reach the client.
type recorder struct {
	w        http.ResponseWriter
	header   http.Header
	status   int
	body     bytes.Buffer
	max      int64
	streamed bool // the body outgrew max and went to w
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 && status >= 200 { // 1xx are informational; keep waiting for the final status
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.streamed {
		return r.w.Write(p)
	}
	if int64(r.body.Len())+int64(len(p)) <= r.max {
		return r.body.Write(p)
	}
	r.streamed = true
	r.w.WriteHeader(r.status)
	_, err := r.w.Write(r.body.Bytes())
	r.body = bytes.Buffer{}
	if err != nil {
		return 0, err
	}
	return r.w.Write(p)
}

func (r *recorder) statusCode() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}
