package idemotel_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// traces is an SDK tracer provider whose ended spans go, synchronously, to
// the SDK's in-memory exporter, and a signal for each one, so that tests
// wait for spans instead of sleeping.
type traces struct {
	tp    *sdktrace.TracerProvider
	exp   *tracetest.InMemoryExporter
	ended chan struct{}
}

func newTraces(t testing.TB) *traces {
	tr := &traces{exp: tracetest.NewInMemoryExporter(), ended: make(chan struct{}, 1)}
	tr.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(tr.exp), sdktrace.WithSpanProcessor(signal(tr.ended)))
	t.Cleanup(func() { _ = tr.tp.Shutdown(context.Background()) })
	return tr
}

// signal is a span processor that only says a span ended.
type signal chan struct{}

func (s signal) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (s signal) OnEnd(sdktrace.ReadOnlySpan) {
	select {
	case s <- struct{}{}:
	default:
	}
}
func (s signal) Shutdown(context.Context) error   { return nil }
func (s signal) ForceFlush(context.Context) error { return nil }

// tracer is the idem tracer over tr's provider.
func (tr *traces) tracer(system idemotel.System, opts ...idemotel.Option) *idemotel.Tracer {
	return idemotel.New(system, append([]idemotel.Option{idemotel.WithTracerProvider(tr.tp)}, opts...)...)
}

// spans returns the ended spans that match.
func (tr *traces) spans(match func(tracetest.SpanStub) bool) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.exp.GetSpans() {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

// wait waits until n ended spans match, re-checking on every span that
// ends, and returns them.
func (tr *traces) wait(t testing.TB, n int, what string, match func(tracetest.SpanStub) bool) []tracetest.SpanStub {
	t.Helper()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for {
		if got := tr.spans(match); len(got) >= n {
			return got
		}
		select {
		case <-tr.ended:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %d spans: %s; ended: %s", n, what, names(tr.exp.GetSpans()))
		}
	}
}

func names(spans []tracetest.SpanStub) string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = fmt.Sprintf("%s(%s)", s.Name, attr(s, idemotel.OutcomeKey).String())
	}
	return fmt.Sprint(out)
}

// processSpan matches the span of the message with id.
func processSpan(id string) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool {
		return s.SpanKind == trace.SpanKindConsumer && attr(s, "messaging.message.id").AsString() == id
	}
}

func named(name string) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool { return s.Name == name }
}

func attr(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

func hasAttr(s tracetest.SpanStub, k attribute.Key) bool {
	return slices.ContainsFunc(s.Attributes, func(a attribute.KeyValue) bool { return a.Key == k })
}

// wantAttrs fails t unless s has every attribute of want.
func wantAttrs(t testing.TB, s tracetest.SpanStub, want ...attribute.KeyValue) {
	t.Helper()
	for _, w := range want {
		if got := attr(s, w.Key); got != w.Value {
			t.Errorf("span %q: %s = %q, want %q", s.Name, w.Key, got.String(), w.Value.String())
		}
	}
}

// events returns s's events named name.
func events(s tracetest.SpanStub, name string) []sdktrace.Event {
	var out []sdktrace.Event
	for _, e := range s.Events {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

func eventAttr(e sdktrace.Event, k attribute.Key) attribute.Value {
	for _, a := range e.Attributes {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

// db is a fresh PostgreSQL schema with an inbox and an invoices table the
// handlers write.
type db struct {
	pool *pgxpool.Pool
}

func newDB(t testing.TB) *db {
	t.Helper()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE invoices (id text PRIMARY KEY, body text NOT NULL)`); err != nil {
		t.Fatalf("creating invoices: %v (%s)", err, pgtest.FixHint)
	}
	return &db{pool: pool}
}

// invoice is the handler most tests use: one row per message.
func invoice(ctx context.Context, tx pgx.Tx, m idem.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO invoices (id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
	return err
}

func (d *db) invoices(t testing.TB) int {
	t.Helper()
	var n int
	if err := d.pool.QueryRow(context.Background(), `SELECT count(*) FROM invoices`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// processor is a processor over d's inbox with hooks; mod changes its
// configuration.
func (d *db) processor(t testing.TB, consumer string, h idem.Handler[pgx.Tx], hooks []idem.Hook, mod ...func(*idem.Config[pgx.Tx])) *idem.Processor[pgx.Tx] {
	t.Helper()
	store, err := pgxinbox.New(d.pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h == nil {
		h = invoice
	}
	cfg := &idem.Config[pgx.Tx]{
		Consumer: consumer,
		Key:      idem.ByMessageID,
		Handler:  h,
		Hooks:    hooks,
		Logger:   quiet,
		Retry:    idem.RetryPolicy{Backoff: idem.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}},
	}
	for _, m := range mod {
		m(cfg)
	}
	p, err := idem.NewProcessor(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// produced starts and ends a producer span in tr and returns the headers
// that carry it, as a producer publishing the message would write them.
func (tr *traces) produced(name string) (trace.SpanContext, map[string]string) {
	ctx, span := tr.tp.Tracer("producer").Start(context.Background(), name, trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	return span.SpanContext(), idemotel.Inject(ctx, nil)
}

// ends counts, per message ID, how many times a TraceHook's end was called,
// around the real tracer.
type ends struct {
	idem.TraceHook
	mu      sync.Mutex
	message map[string]int
	batches int
}

func countEnds(h idem.TraceHook) *ends { return &ends{TraceHook: h, message: map[string]int{}} }

func (e *ends) StartMessage(ctx context.Context, consumer string, msg idem.Message) (context.Context, func(idem.Result)) {
	ctx, end := e.TraceHook.StartMessage(ctx, consumer, msg)
	return ctx, func(r idem.Result) {
		e.mu.Lock()
		e.message[msg.ID]++
		e.mu.Unlock()
		end(r)
	}
}

func (e *ends) StartBatch(ctx context.Context, consumer string, msgs []idem.Message) (context.Context, func([]idem.Result)) {
	ctx, end := e.TraceHook.StartBatch(ctx, consumer, msgs)
	return ctx, func(rs []idem.Result) {
		e.mu.Lock()
		e.batches++
		e.mu.Unlock()
		end(rs)
	}
}

func (e *ends) count(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.message[id]
}
