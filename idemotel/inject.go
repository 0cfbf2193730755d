package idemotel

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

// Inject writes the trace context of ctx (W3C traceparent and tracestate,
// and its baggage) into headers, for a producer whose message headers are
// strings, and returns headers, allocated when nil and ctx has something
// to write.
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	InjectFunc(ctx, func(k, v string) {
		if headers == nil {
			headers = make(map[string]string, 3)
		}
		headers[k] = v
	})
	return headers
}

// InjectAMQP is [Inject] for an AMQP header table (an amqp.Table is one),
// with string values:
//
//	pub.Headers = idemotel.InjectAMQP(ctx, pub.Headers)
func InjectAMQP(ctx context.Context, headers map[string]any) map[string]any {
	InjectFunc(ctx, func(k, v string) {
		if headers == nil {
			headers = make(map[string]any, 3)
		}
		headers[k] = v
	})
	return headers
}

// InjectFunc calls set with each header the trace context of ctx needs, for
// headers of any other shape, such as a Kafka record's:
//
//	idemotel.InjectFunc(ctx, func(k, v string) {
//		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
//	})
func InjectFunc(ctx context.Context, set func(key, value string)) {
	w3c.Inject(ctx, setter(set))
}

// setter is a write-only carrier.
type setter func(key, value string)

func (s setter) Get(string) string     { return "" }
func (s setter) Set(key, value string) { s(key, value) }
func (s setter) Keys() []string        { return nil }

var _ propagation.TextMapCarrier = setter(nil)
