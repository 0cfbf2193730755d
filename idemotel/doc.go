// Package idemotel traces idem consumers with OpenTelemetry: a span per
// message and per batch, following the messaging semantic conventions,
// under the trace of the producer that published the message.
//
// It is a module of its own (github.com/idemkit/idem/idemotel), so that a
// consumer without OpenTelemetry does not depend on it.
//
// A [Tracer] is an [idem.TraceHook]: put it in idem.Config.Hooks and every
// Process, ProcessTx, ProcessBatch and ProcessBatchInOrder call of that
// processor, the broker adapters' included, is traced:
//
//	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
//		Consumer: "billing-invoice",
//		Key:      idem.ByMessageID,
//		Handler:  invoice,
//		Hooks:    []idem.Hook{idemotel.New(idemotel.RabbitMQ, idemotel.WithTracerProvider(tp))},
//	})
//
// # Spans
//
// Each message gets a "process <destination>" span of kind consumer whose
// parent is the producer's span, taken from the message's W3C traceparent,
// tracestate and baggage headers: the consumer's span is in the producer's
// trace. A message without them is a child of the span in the caller's
// context (the batch's, in a batch), or the root of a trace of its own.
// The span carries messaging.system, messaging.operation.type (process),
// messaging.destination.name (the queue, or the topic and
// messaging.destination.partition.id), messaging.message.id,
// messaging.consumer.group.name, and, when the message's result is known,
// idem.outcome (applied, duplicate, retry, dead_lettered, expired) and
// idem.attempts. A message that is not acknowledged (retry, dead_lettered,
// expired) ends with status Error, error.type set to its outcome and the
// error recorded. Every failed try in place is an "idem.attempt" event,
// with the try's number, the error's class, whether the processor tries
// again, and after what wait. One message gets one span per call, however
// many tries it took.
//
// A batch of more than one message gets a span of its own, "process
// <destination>" with messaging.batch.message_count, linked to the
// producer span of each of its messages (they belong to many traces), and
// ending with the count of each outcome. Each message of the batch keeps
// its own span in its producer's trace, linked to the batch span.
//
// The handler's context carries the message's span (and the producer's
// baggage), so the spans the handler starts from it, for its database
// statements or its HTTP calls, nest under the message's span.
//
// # Producers
//
// [Inject], [InjectAMQP] and [InjectFunc] write the trace context of a
// producer's context into the headers of the message it publishes, in the
// W3C format the Tracer reads by default.
package idemotel
