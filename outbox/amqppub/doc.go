// Package amqppub publishes outbox records to RabbitMQ with amqp091-go: it
// is the [outbox.Publisher] a relay uses to send committed rows to
// exchanges.
//
// A record is published to the exchange named by its Destination ("" is
// the default exchange, where the routing key names the queue) with its
// RoutingKey, mandatory and persistent, on a channel in confirm mode. Its ID
// is the AMQP message_id property (what an idemrabbitmq consumer reads),
// its event time the timestamp property and the "x-event-time" header
// (idembroker.HeaderEventTime, RFC 3339 with nanoseconds), next to the
// caller's headers. A record is reported published only once the broker
// confirmed it and did not return it.
//
// # Order
//
// A channel delivers in publish order, but the broker decides each message
// on its own: a queue full with reject-publish nacks one message and takes
// the next, a return for one (no route) does not stop the next. Had a key's
// next record gone out with its predecessor, it would be delivered ahead of
// the predecessor's republish. So a key's next record is published only
// once its previous one was confirmed; records of different keys go out
// together. A call costs as many confirm round trips as its busiest key
// has records, and one when every key has one record. When a record fails,
// its key's later records of the call are not published
// ([outbox.ErrNotAttempted]).
//
// # Refused or unreachable
//
// A record is refused ([outbox.IsRefused]) for its own fault only: a
// mandatory message the broker routed to no queue (the error wraps
// idemrabbitmq.ErrUnroutable), an exchange that does not exist (checked
// before the record is published, since publishing to it would close the
// channel and take its neighbours' confirms with it), or a body larger than
// [Config.MaxBodyBytes]. A nack, a closed channel or connection, and a
// broker that does not answer are outages: the relay retries them. After a
// closed channel the next call opens another; after a closed connection it
// dials again with [Config.Redial] when set, and otherwise every call fails
// until the caller gives the relay a publisher on a new connection.
package amqppub
