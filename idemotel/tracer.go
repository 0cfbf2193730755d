package idemotel

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// ScopeName is the instrumentation scope of the spans a [Tracer] starts.
const ScopeName = "github.com/idemkit/idem/idemotel"

// System is the messaging system a consumer reads from, the value of the
// messaging.system attribute.
type System string

// The systems idem has adapters for.
const (
	// RabbitMQ: Message.Source is the queue, Message.Key the routing key.
	RabbitMQ System = "rabbitmq"
	// Kafka: Message.Source is "<topic>/<partition>", Message.Key the
	// record key.
	Kafka System = "kafka"
)

// Attributes idem adds to the semantic conventions' own.
const (
	// OutcomeKey is the message's outcome: applied, duplicate, retry,
	// dead_lettered or expired.
	OutcomeKey = attribute.Key("idem.outcome")
	// AttemptsKey is how many transactions the processor ran with the
	// message in this call (idem.Result.Attempts).
	AttemptsKey = attribute.Key("idem.attempts")
	// ConsumerKey is the idem consumer, whose inbox deduplicates.
	ConsumerKey = attribute.Key("idem.consumer")
	// FirstMessageIDKey is, on a duplicate, the message that claimed the
	// key first, when known.
	FirstMessageIDKey = attribute.Key("idem.first_message_id")
	// ConflictKey is set on a duplicate whose body differs from the first
	// message's: a producer that reused a key for other content.
	ConflictKey = attribute.Key("idem.conflict")
	// BlamelessKey is set on a retry that is not the message's fault (an
	// outage, a shutdown, an earlier message to retry first).
	BlamelessKey = attribute.Key("idem.blameless")
	// RedeliveredKey is set when the broker flagged the delivery as seen
	// before (a hint; the inbox decides).
	RedeliveredKey = attribute.Key("idem.redelivered")
)

// AttemptEvent is the name of the span event of each failed try; its
// attributes are idem.attempt.try, idem.attempt.class (transient,
// permanent, unavailable, busy, config), idem.attempt.again,
// idem.attempt.wait_ms, idem.attempt.batch and exception.message.
const AttemptEvent = "idem.attempt"

// Tracer is an [idem.TraceHook] that traces with OpenTelemetry. Put it in
// idem.Config.Hooks. It is safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	system System
	group  string
}

var _ idem.TraceHook = (*Tracer)(nil)

// Option configures a [Tracer].
type Option func(*Tracer)

// WithTracerProvider sets where spans go. Defaults to the global provider
// (otel.GetTracerProvider), read when New is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(t *Tracer) {
		if tp != nil {
			t.tracer = tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
		}
	}
}

// WithPropagator sets how the trace context is read from message headers.
// Defaults to W3C Trace Context and Baggage (traceparent, tracestate,
// baggage), what [Inject] writes; it is not the global propagator, which
// propagates nothing unless set. Pass otel.GetTextMapPropagator() to use
// the global one.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(t *Tracer) {
		if p != nil {
			t.prop = p
		}
	}
}

// WithConsumerGroup sets messaging.consumer.group.name. Defaults to the idem
// consumer name (the consumers that share an inbox); set the Kafka consumer
// group when it is named otherwise.
func WithConsumerGroup(name string) Option {
	return func(t *Tracer) { t.group = name }
}

// New returns a Tracer for consumers of system.
func New(system System, opts ...Option) *Tracer {
	t := &Tracer{system: system, prop: w3c}
	for _, o := range opts {
		o(t)
	}
	if t.tracer == nil {
		t.tracer = otel.GetTracerProvider().Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
	}
	return t
}

// w3c is the default propagator, and the one the Inject functions write.
var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// StartMessage starts msg's span, child of the producer's span its headers
// name, and linked to the span of ctx (a batch's) when that is another.
func (t *Tracer) StartMessage(ctx context.Context, consumer string, msg idem.Message) (context.Context, func(idem.Result)) {
	caller := trace.SpanContextFromContext(ctx)
	ctx = t.prop.Extract(ctx, propagation.MapCarrier(msg.Headers))
	dest, partition := t.destination(msg.Source)
	attrs := t.common(consumer, dest, partition)
	if msg.ID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(msg.ID))
	}
	if msg.Key != "" {
		switch t.system {
		case Kafka:
			attrs = append(attrs, semconv.MessagingKafkaMessageKey(msg.Key))
		case RabbitMQ:
			attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(msg.Key))
		}
	}
	attrs = append(attrs, semconv.MessagingMessageBodySize(len(msg.Body)))
	if msg.Redelivered {
		attrs = append(attrs, RedeliveredKey.Bool(true))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if parent := trace.SpanContextFromContext(ctx); caller.IsValid() && !parent.Equal(caller) {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: caller}))
	}
	ctx, span := t.tracer.Start(ctx, spanName(dest), opts...)
	return ctx, func(r idem.Result) { endMessage(span, r) }
}

func endMessage(span trace.Span, r idem.Result) {
	if !span.IsRecording() {
		span.End()
		return
	}
	attrs := []attribute.KeyValue{OutcomeKey.String(r.Outcome.String()), AttemptsKey.Int(r.Attempts)}
	switch r.Outcome {
	case idem.Duplicate:
		if r.First != nil && r.First.MessageID != "" {
			attrs = append(attrs, FirstMessageIDKey.String(r.First.MessageID))
		}
		if r.Conflict {
			attrs = append(attrs, ConflictKey.Bool(true))
		}
	case idem.Retry:
		if r.Blameless {
			attrs = append(attrs, BlamelessKey.Bool(true))
		}
	}
	if !r.Outcome.Acked() {
		attrs = append(attrs, semconv.ErrorTypeKey.String(r.Outcome.String()))
		desc := r.Outcome.String()
		if r.Err != nil {
			desc = r.Err.Error()
			span.RecordError(r.Err)
		}
		span.SetStatus(codes.Error, desc)
	}
	span.SetAttributes(attrs...)
	span.End()
}

// StartBatch starts the span of a batch, linked to the producer span of
// each of msgs.
func (t *Tracer) StartBatch(ctx context.Context, consumer string, msgs []idem.Message) (context.Context, func([]idem.Result)) {
	var dest, partition string
	if len(msgs) > 0 {
		dest, partition = t.destination(msgs[0].Source)
		for _, m := range msgs[1:] {
			if m.Source != msgs[0].Source {
				dest, partition = "", ""
				break
			}
		}
	}
	attrs := append(t.common(consumer, dest, partition), semconv.MessagingBatchMessageCount(len(msgs)))
	links := make([]trace.Link, 0, len(msgs))
	for _, m := range msgs {
		sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
		if sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{semconv.MessagingMessageID(m.ID)}})
		}
	}
	ctx, span := t.tracer.Start(ctx, spanName(dest), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...), trace.WithLinks(links...))
	return ctx, func(rs []idem.Result) { endBatch(span, rs) }
}

func endBatch(span trace.Span, rs []idem.Result) {
	if !span.IsRecording() {
		span.End()
		return
	}
	var counts [idem.Expired + 1]int
	notAcked := 0
	for _, r := range rs {
		if r.Outcome >= idem.Applied && r.Outcome <= idem.Expired {
			counts[r.Outcome]++
		}
		if !r.Outcome.Acked() {
			notAcked++
		}
	}
	attrs := make([]attribute.KeyValue, 0, len(counts))
	var failed []string
	for o := idem.Applied; o <= idem.Expired; o++ {
		attrs = append(attrs, attribute.Int("idem.batch."+o.String(), counts[o]))
		if !o.Acked() && counts[o] > 0 {
			failed = append(failed, fmt.Sprintf("%s %d", o, counts[o]))
		}
	}
	span.SetAttributes(attrs...)
	if notAcked > 0 {
		span.SetStatus(codes.Error, fmt.Sprintf("%d of %d messages not acknowledged (%s)", notAcked, len(rs), strings.Join(failed, ", ")))
	}
	span.End()
}

// TraceAttempt records a failed try as an event of the span in ctx.
func (t *Tracer) TraceAttempt(ctx context.Context, _ string, a idem.Attempt) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.Int("idem.attempt.try", a.Try),
		attribute.String("idem.attempt.class", className(a.Class)),
		attribute.Bool("idem.attempt.again", a.Again),
		attribute.Int64("idem.attempt.wait_ms", a.Wait.Milliseconds()),
		attribute.Bool("idem.attempt.batch", a.Batch),
	}
	if a.Err != nil {
		attrs = append(attrs, semconv.ExceptionMessage(a.Err.Error()))
	}
	span.AddEvent(AttemptEvent, trace.WithAttributes(attrs...))
}

func className(c idemstore.ErrorClass) string {
	switch c {
	case idemstore.ClassTransient:
		return "transient"
	case idemstore.ClassPermanent:
		return "permanent"
	case idemstore.ClassUnavailable:
		return "unavailable"
	case idemstore.ClassBusy:
		return "busy"
	case idemstore.ClassConfig:
		return "config"
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// common are the attributes of every span: system, operation, destination
// and consumer.
func (t *Tracer) common(consumer, dest, partition string) []attribute.KeyValue {
	group := t.group
	if group == "" {
		group = consumer
	}
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		semconv.MessagingSystemKey.String(string(t.system)),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingConsumerGroupName(group),
		ConsumerKey.String(consumer),
	)
	if dest != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(dest))
	}
	if partition != "" {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(partition))
	}
	return attrs
}

// destination splits a message's source into the destination name and,
// for Kafka, the partition.
func (t *Tracer) destination(source string) (dest, partition string) {
	if t.system == Kafka {
		if i := strings.LastIndexByte(source, '/'); i >= 0 {
			return source[:i], source[i+1:]
		}
	}
	return source, ""
}

// spanName is "process <destination>", or "process" when the destination is
// not known or not one.
func spanName(dest string) string {
	if dest == "" {
		return "process"
	}
	return "process " + dest
}
