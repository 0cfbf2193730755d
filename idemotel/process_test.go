package idemotel_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// TestProcessUnderProducerTrace: the message's span is a child of the
// producer's span, in its trace; the handler's own span nests under it;
// a second delivery gets a span of its own with outcome duplicate.
func TestProcessUnderProducerTrace(t *testing.T) {
	t.Parallel()
	tr, d := newTraces(t), newDB(t)
	app := tr.tp.Tracer("billing")
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		ctx, span := app.Start(ctx, "INSERT invoices")
		defer span.End()
		return invoice(ctx, tx, m)
	}
	p := d.processor(t, "billing-invoice", h, []idem.Hook{tr.tracer(idemotel.RabbitMQ)})
	producer, headers := tr.produced("send invoices")
	msg := idem.Message{ID: "inv-1", Source: "invoices", Key: "invoice.created", Headers: headers, Body: []byte("12500")}

	if r := p.Process(t.Context(), msg); r.Outcome != idem.Applied {
		t.Fatalf("first delivery: %v (%v), want applied", r.Outcome, r.Err)
	}
	spans := tr.spans(processSpan("inv-1"))
	if len(spans) != 1 {
		t.Fatalf("%d process spans after one delivery, want 1: %s", len(spans), names(tr.exp.GetSpans()))
	}
	s := spans[0]
	if s.SpanContext.TraceID() != producer.TraceID() || s.Parent.SpanID() != producer.SpanID() {
		t.Errorf("process span in trace %s under %s, want trace %s under the producer's span %s",
			s.SpanContext.TraceID(), s.Parent.SpanID(), producer.TraceID(), producer.SpanID())
	}
	if !s.Parent.IsRemote() {
		t.Error("the producer's span context is not marked remote")
	}
	if s.Name != "process invoices" {
		t.Errorf("span name %q, want %q", s.Name, "process invoices")
	}
	wantAttrs(t, s,
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", "invoices"),
		attribute.String("messaging.message.id", "inv-1"),
		attribute.String("messaging.consumer.group.name", "billing-invoice"),
		attribute.String("messaging.rabbitmq.destination.routing_key", "invoice.created"),
		attribute.String("idem.consumer", "billing-invoice"),
		attribute.String("idem.outcome", "applied"),
		attribute.Int("idem.attempts", 1),
	)
	if s.Status.Code == codes.Error {
		t.Errorf("applied message has status %v %q", s.Status.Code, s.Status.Description)
	}
	own := tr.spans(named("INSERT invoices"))
	if len(own) != 1 {
		t.Fatalf("%d handler spans, want 1", len(own))
	}
	if own[0].Parent.SpanID() != s.SpanContext.SpanID() || own[0].SpanContext.TraceID() != producer.TraceID() {
		t.Errorf("handler span under %s in trace %s, want under the process span %s in the producer's trace",
			own[0].Parent.SpanID(), own[0].SpanContext.TraceID(), s.SpanContext.SpanID())
	}

	if r := p.Process(t.Context(), msg); r.Outcome != idem.Duplicate {
		t.Fatalf("second delivery: %v (%v), want duplicate", r.Outcome, r.Err)
	}
	spans = tr.spans(processSpan("inv-1"))
	if len(spans) != 2 {
		t.Fatalf("%d process spans after two deliveries, want 2", len(spans))
	}
	dup := spans[1]
	wantAttrs(t, dup, attribute.String("idem.outcome", "duplicate"), attribute.String("idem.first_message_id", "inv-1"))
	if dup.SpanContext.TraceID() != producer.TraceID() || dup.Parent.SpanID() != producer.SpanID() {
		t.Error("the duplicate's span is not under the producer's span")
	}
	if n := len(tr.spans(named("INSERT invoices"))); n != 1 {
		t.Errorf("%d handler spans after a duplicate, want 1 (the handler does not run)", n)
	}
	if n := d.invoices(t); n != 1 {
		t.Errorf("%d invoices, want 1", n)
	}
}

// TestUntracedHandlerHasNoSpan: without a TraceHook the handler's context
// carries no span, even for a message whose headers name one.
func TestUntracedHandlerHasNoSpan(t *testing.T) {
	t.Parallel()
	tr, d := newTraces(t), newDB(t)
	var seen []trace.SpanContext
	var mu sync.Mutex
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		mu.Lock()
		seen = append(seen, trace.SpanContextFromContext(ctx))
		mu.Unlock()
		return invoice(ctx, tx, m)
	}
	p := d.processor(t, "untraced", h, nil)
	_, headers := tr.produced("send")
	if r := p.Process(t.Context(), idem.Message{ID: "m-1", Headers: headers}); r.Outcome != idem.Applied {
		t.Fatalf("%v (%v), want applied", r.Outcome, r.Err)
	}
	for _, r := range p.ProcessBatch(t.Context(), []idem.Message{{ID: "m-2", Headers: headers}, {ID: "m-3", Headers: headers}}) {
		if r.Outcome != idem.Applied {
			t.Fatalf("batch: %v (%v), want applied", r.Outcome, r.Err)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("handler ran %d times, want 3", len(seen))
	}
	for i, sc := range seen {
		if sc.IsValid() {
			t.Errorf("run %d: the handler's context carries span %s with no TraceHook", i, sc.SpanID())
		}
	}
	if n := len(tr.spans(func(s tracetest.SpanStub) bool { return s.SpanKind == trace.SpanKindConsumer })); n != 0 {
		t.Errorf("%d consumer spans with no TraceHook", n)
	}
}

// TestBatchLinksEveryProducer: a batch's span links to the producer span of
// each of its messages; each message keeps its span in its producer's
// trace, linked to the batch's; a message without trace context nests
// under the batch. In the shared transaction each handler runs under its
// own message's span, with the transaction's deadline.
func TestBatchLinksEveryProducer(t *testing.T) {
	t.Parallel()
	tr, d := newTraces(t), newDB(t)
	app := tr.tp.Tracer("billing")
	var mu sync.Mutex
	deadlines := map[string]bool{}
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		_, hasDeadline := ctx.Deadline()
		mu.Lock()
		deadlines[m.ID] = hasDeadline
		mu.Unlock()
		ctx, span := app.Start(ctx, "INSERT "+m.ID)
		defer span.End()
		return invoice(ctx, tx, m)
	}
	ends := countEnds(tr.tracer(idemotel.Kafka))
	p := d.processor(t, "ledger", h, []idem.Hook{ends})
	var producers []trace.SpanContext
	var msgs []idem.Message
	for _, id := range []string{"b-1", "b-2", "b-3"} {
		sc, headers := tr.produced("send " + id)
		producers = append(producers, sc)
		msgs = append(msgs, idem.Message{ID: id, Source: "ledger/3", Key: "acct-7", Headers: headers})
	}
	msgs = append(msgs, idem.Message{ID: "b-untraced", Source: "ledger/3"})

	for i, r := range p.ProcessBatchInOrder(t.Context(), msgs) {
		if r.Outcome != idem.Applied {
			t.Fatalf("message %d: %v (%v), want applied", i, r.Outcome, r.Err)
		}
	}
	batches := tr.spans(func(s tracetest.SpanStub) bool { return hasAttr(s, "messaging.batch.message_count") })
	if len(batches) != 1 {
		t.Fatalf("%d batch spans, want 1: %s", len(batches), names(tr.exp.GetSpans()))
	}
	b := batches[0]
	wantAttrs(t, b,
		attribute.Int("messaging.batch.message_count", 4),
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.destination.name", "ledger"),
		attribute.String("messaging.destination.partition.id", "3"),
		attribute.Int("idem.batch.applied", 4),
		attribute.Int("idem.batch.dead_lettered", 0),
	)
	if len(b.Links) != len(producers) {
		t.Fatalf("batch span has %d links, want %d (one per traced message)", len(b.Links), len(producers))
	}
	for i, l := range b.Links {
		if l.SpanContext.SpanID() != producers[i].SpanID() || l.SpanContext.TraceID() != producers[i].TraceID() {
			t.Errorf("link %d to %s, want the producer span of %s", i, l.SpanContext.SpanID(), msgs[i].ID)
		}
	}
	for i, m := range msgs {
		spans := tr.spans(processSpan(m.ID))
		if len(spans) != 1 {
			t.Fatalf("%s: %d spans, want 1", m.ID, len(spans))
		}
		s := spans[0]
		wantAttrs(t, s, attribute.String("idem.outcome", "applied"))
		if i < len(producers) {
			wantAttrs(t, s, attribute.String("messaging.kafka.message.key", "acct-7"))
			if s.SpanContext.TraceID() != producers[i].TraceID() || s.Parent.SpanID() != producers[i].SpanID() {
				t.Errorf("%s: span not under its producer's span", m.ID)
			}
			if len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != b.SpanContext.SpanID() {
				t.Errorf("%s: links %v, want one to the batch span %s", m.ID, s.Links, b.SpanContext.SpanID())
			}
		} else if s.Parent.SpanID() != b.SpanContext.SpanID() || len(s.Links) != 0 {
			t.Errorf("%s (no trace context): under %s with %d links, want under the batch span %s", m.ID, s.Parent.SpanID(), len(s.Links), b.SpanContext.SpanID())
		}
		own := tr.spans(named("INSERT " + m.ID))
		if len(own) != 1 || own[0].Parent.SpanID() != s.SpanContext.SpanID() {
			t.Errorf("%s: the handler's span is not under the message's span", m.ID)
		}
		if !deadlines[m.ID] {
			t.Errorf("%s: the handler's context lost the transaction's deadline", m.ID)
		}
		if n := ends.count(m.ID); n != 1 {
			t.Errorf("%s: span ended %d times, want 1", m.ID, n)
		}
	}
	if ends.batches != 1 {
		t.Errorf("batch span ended %d times, want 1", ends.batches)
	}
}

// TestBatchFallbackEndsEachSpanOnce: a batch whose shared transaction a
// poison message fails falls back to one message at a time; every message
// still gets exactly one span, with its own outcome, and the batch span
// says how many were not acknowledged.
func TestBatchFallbackEndsEachSpanOnce(t *testing.T) {
	t.Parallel()
	tr, d := newTraces(t), newDB(t)
	// The poison message's invoice exists already: its INSERT breaks the
	// primary key, a permanent error.
	if _, err := d.pool.Exec(t.Context(), `INSERT INTO invoices (id, body) VALUES ('poison', 'earlier')`); err != nil {
		t.Fatal(err)
	}
	ends := countEnds(tr.tracer(idemotel.RabbitMQ))
	p := d.processor(t, "stock", nil, []idem.Hook{ends}, func(c *idem.Config[pgx.Tx]) {
		c.Horizon = idem.Horizon{Window: 24 * time.Hour}
	})
	old := time.Now().Add(-30 * 24 * time.Hour)
	msgs := []idem.Message{
		{ID: "a", Source: "stock"},
		{ID: "poison", Source: "stock"},
		{ID: "old", Source: "stock", Time: old, TimeSource: idem.TimeFromHeader},
		{ID: "c", Source: "stock"},
	}
	rs := p.ProcessBatchInOrder(t.Context(), msgs)
	want := []idem.Outcome{idem.Applied, idem.DeadLettered, idem.Expired, idem.Applied}
	for i, r := range rs {
		if r.Outcome != want[i] {
			t.Fatalf("%s: %v (%v), want %v", msgs[i].ID, r.Outcome, r.Err, want[i])
		}
	}
	for i, m := range msgs {
		spans := tr.spans(processSpan(m.ID))
		if len(spans) != 1 || ends.count(m.ID) != 1 {
			t.Fatalf("%s: %d spans recorded, ended %d times, want 1 and 1", m.ID, len(spans), ends.count(m.ID))
		}
		s := spans[0]
		wantAttrs(t, s, attribute.String("idem.outcome", want[i].String()))
		failed := !want[i].Acked()
		if (s.Status.Code == codes.Error) != failed {
			t.Errorf("%s: status %v, want error=%v", m.ID, s.Status.Code, failed)
		}
		if failed {
			wantAttrs(t, s, attribute.String("error.type", want[i].String()))
			if len(events(s, "exception")) != 1 {
				t.Errorf("%s: %d exception events, want 1", m.ID, len(events(s, "exception")))
			}
		}
	}
	poison := tr.spans(processSpan("poison"))[0]
	tries := events(poison, idemotel.AttemptEvent)
	if len(tries) != 1 || eventAttr(tries[0], "idem.attempt.class").AsString() != "permanent" || eventAttr(tries[0], "idem.attempt.again").AsBool() {
		t.Errorf("poison: attempt events %v, want one, permanent, not again", tries)
	}
	batches := tr.spans(func(s tracetest.SpanStub) bool { return hasAttr(s, "messaging.batch.message_count") })
	if len(batches) != 1 || ends.batches != 1 {
		t.Fatalf("%d batch spans, ended %d times, want 1 and 1", len(batches), ends.batches)
	}
	b := batches[0]
	wantAttrs(t, b, attribute.Int("idem.batch.applied", 2), attribute.Int("idem.batch.dead_lettered", 1), attribute.Int("idem.batch.expired", 1))
	if b.Status.Code != codes.Error {
		t.Errorf("batch status %v, want error (two messages not acknowledged)", b.Status.Code)
	}
	// The shared try that the poison failed is the batch's event.
	shared := events(b, idemotel.AttemptEvent)
	if len(shared) != 1 || !eventAttr(shared[0], "idem.attempt.batch").AsBool() {
		t.Errorf("batch: attempt events %v, want the one shared try", shared)
	}
}

// TestFailingHandlerRecordsTries: a handler whose downstream service is
// down (a closed port) fails every try; the message's one span records
// each try as an event and ends in error once the budget is spent.
func TestFailingHandlerRecordsTries(t *testing.T) {
	t.Parallel()
	tr, d := newTraces(t), newDB(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + l.Addr().String() + "/charge"
	_ = l.Close() // nothing listens there any more
	app := tr.tp.Tracer("billing")
	h := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		ctx, span := app.Start(ctx, "POST /charge")
		defer span.End()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gone, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	ends := countEnds(tr.tracer(idemotel.RabbitMQ))
	p := d.processor(t, "payments", h, []idem.Hook{ends}, func(c *idem.Config[pgx.Tx]) { c.Retry.MaxAttempts = 3 })
	producer, headers := tr.produced("send payment")
	r := p.Process(t.Context(), idem.Message{ID: "pay-1", Source: "payments", Headers: headers})
	if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, idem.ErrRetriesExhausted) {
		t.Fatalf("%v (%v), want dead-lettered with retries exhausted", r.Outcome, r.Err)
	}
	spans := tr.spans(processSpan("pay-1"))
	if len(spans) != 1 || ends.count("pay-1") != 1 {
		t.Fatalf("%d spans, ended %d times, want 1 and 1 for three tries", len(spans), ends.count("pay-1"))
	}
	s := spans[0]
	if s.SpanContext.TraceID() != producer.TraceID() {
		t.Error("the failing message's span is not in the producer's trace")
	}
	if s.Status.Code != codes.Error || s.Status.Description != r.Err.Error() {
		t.Errorf("status %v %q, want error %q", s.Status.Code, s.Status.Description, r.Err)
	}
	wantAttrs(t, s, attribute.String("idem.outcome", "dead_lettered"), attribute.Int("idem.attempts", 3), attribute.String("error.type", "dead_lettered"))
	tries := events(s, idemotel.AttemptEvent)
	if len(tries) != 3 {
		t.Fatalf("%d attempt events, want 3", len(tries))
	}
	for i, e := range tries {
		if got := eventAttr(e, "idem.attempt.try").AsInt64(); got != int64(i+1) {
			t.Errorf("event %d: try %d", i, got)
		}
		if got, want := eventAttr(e, "idem.attempt.again").AsBool(), i < 2; got != want {
			t.Errorf("event %d: again %v, want %v", i, got, want)
		}
		if eventAttr(e, "idem.attempt.class").AsString() == "" {
			t.Errorf("event %d: no error class", i)
		}
		if eventAttr(e, "exception.message").AsString() == "" {
			t.Errorf("event %d: no error message", i)
		}
	}
	calls := tr.spans(named("POST /charge"))
	if len(calls) != 3 {
		t.Fatalf("%d handler spans, want one per try (3)", len(calls))
	}
	for _, c := range calls {
		if c.Parent.SpanID() != s.SpanContext.SpanID() {
			t.Error("a try's handler span is not under the message's span")
		}
	}
}

// TestProcessTxTraced: ProcessTx traces the message in the caller's
// transaction, and a failing claim or handler ends the span in error.
func TestProcessTxTraced(t *testing.T) {
	t.Parallel()
	tr, d := newTraces(t), newDB(t)
	p := d.processor(t, "refunds", nil, []idem.Hook{tr.tracer(idemotel.RabbitMQ)})
	producer, headers := tr.produced("send refund")
	ctx := t.Context()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := p.ProcessTx(ctx, tx, idem.Message{ID: "ref-1", Source: "refunds", Headers: headers}); err != nil || r.Outcome != idem.Applied {
		t.Fatalf("%v %v, want applied", r.Outcome, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s := tr.spans(processSpan("ref-1"))
	if len(s) != 1 || s[0].Parent.SpanID() != producer.SpanID() {
		t.Fatalf("ProcessTx: spans %s, want one under the producer's", names(s))
	}
	wantAttrs(t, s[0], attribute.String("idem.outcome", "applied"))

	// An invoice written by the caller earlier in the same transaction: the
	// handler's INSERT breaks the primary key.
	tx, err = d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO invoices (id, body) VALUES ('ref-2', 'by hand')`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ProcessTx(ctx, tx, idem.Message{ID: "ref-2", Source: "refunds", Headers: headers}); err == nil {
		t.Fatal("ProcessTx over a broken handler returned no error")
	}
	s = tr.spans(processSpan("ref-2"))
	if len(s) != 1 || s[0].Status.Code != codes.Error {
		t.Fatalf("failed ProcessTx: spans %s, want one with status error", names(s))
	}
	wantAttrs(t, s[0], attribute.String("idem.outcome", "retry"))
}

// TestSeveralTraceHooks: two TraceHooks each end their span once; the
// second starts under the first's context, so its span, under the
// producer's as the headers say, links to the first's. A batch of one
// message is traced as the message alone.
func TestSeveralTraceHooks(t *testing.T) {
	t.Parallel()
	first, second, d := newTraces(t), newTraces(t), newDB(t)
	a, b := countEnds(first.tracer(idemotel.RabbitMQ)), countEnds(second.tracer(idemotel.RabbitMQ))
	p := d.processor(t, "audit", nil, []idem.Hook{a, b})
	producer, headers := first.produced("send")
	rs := p.ProcessBatch(t.Context(), []idem.Message{{ID: "one", Source: "audit", Headers: headers}})
	if len(rs) != 1 || rs[0].Outcome != idem.Applied {
		t.Fatalf("%v, want one applied", rs)
	}
	outer, inner := first.spans(processSpan("one")), second.spans(processSpan("one"))
	if len(outer) != 1 || len(inner) != 1 || a.count("one") != 1 || b.count("one") != 1 {
		t.Fatalf("spans %d and %d, ended %d and %d times, want one each", len(outer), len(inner), a.count("one"), b.count("one"))
	}
	if outer[0].Parent.SpanID() != producer.SpanID() {
		t.Error("the first hook's span is not under the producer's")
	}
	if inner[0].Parent.SpanID() != producer.SpanID() || len(inner[0].Links) != 1 || inner[0].Links[0].SpanContext.SpanID() != outer[0].SpanContext.SpanID() {
		t.Error("the second hook's span is not under the producer's with a link to the first hook's")
	}
	if a.batches != 0 || b.batches != 0 {
		t.Errorf("a batch of one ended %d and %d batch spans, want none", a.batches, b.batches)
	}
}
