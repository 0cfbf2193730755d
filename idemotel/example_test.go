package idemotel_test

import (
	"context"
	"fmt"
	"log/slog"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// A producer injects its trace context into the message's headers; the
// consumer's Tracer, one of the processor's hooks, puts the message's span
// in the producer's trace, and the handler's context carries that span.
func Example() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	// Producer side: publish inside a span, with its context in the headers.
	ctx, span := tp.Tracer("orders").Start(context.Background(), "send invoices", trace.WithSpanKind(trace.SpanKindProducer))
	msg := idem.Message{ID: "inv-1", Source: "invoices", Headers: idemotel.Inject(ctx, nil)}
	span.End()

	// Consumer side.
	var handlerSpan trace.SpanContext
	proc, err := idem.NewProcessor[struct{}](&memStore{keys: map[string]bool{}}, &idem.Config[struct{}]{
		Consumer: "billing-invoice",
		Key:      idem.ByMessageID,
		Logger:   slog.New(slog.DiscardHandler),
		Hooks:    []idem.Hook{idemotel.New(idemotel.RabbitMQ, idemotel.WithTracerProvider(tp))},
		Handler: func(ctx context.Context, _ struct{}, _ idem.Message) error {
			handlerSpan = trace.SpanContextFromContext(ctx)
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	proc.Process(context.Background(), msg)
	proc.Process(context.Background(), msg) // redelivered

	for _, s := range exp.GetSpans() {
		if s.SpanKind != trace.SpanKindConsumer {
			continue
		}
		var outcome string
		for _, a := range s.Attributes {
			if a.Key == idemotel.OutcomeKey {
				outcome = a.Value.AsString()
			}
		}
		fmt.Printf("%s: %s, in the producer's trace: %v, under its span: %v\n", s.Name, outcome,
			s.SpanContext.TraceID() == span.SpanContext().TraceID(), s.Parent.SpanID() == span.SpanContext().SpanID())
	}
	fmt.Println("handler's context carries the first span:", handlerSpan.SpanID() == exp.GetSpans()[1].SpanContext.SpanID())
	// Output:
	// process invoices: applied, in the producer's trace: true, under its span: true
	// process invoices: duplicate, in the producer's trace: true, under its span: true
	// handler's context carries the first span: true
}
