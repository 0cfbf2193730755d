// Package kafkapub publishes outbox records to Kafka with franz-go: it is
// the [outbox.Publisher] a relay uses to send committed rows to Kafka
// topics.
//
// A record goes to the topic named by its Destination with its Key as the
// Kafka key, its Body as the value and its EventTime as the record
// timestamp. Every record carries its ID in the "idem-message-id" header
// (idemkafka.DefaultIDHeader, what an idemkafka consumer reads) and its
// event time in the "x-event-time" header ([idembroker.HeaderEventTime]), next
// to the caller's headers.
//
// # Durability
//
// [New] refuses a client that could lose a record the broker acknowledged
// or write one twice on its own: it must require acks from all in-sync
// replicas and produce idempotently (both franz-go's defaults), must not be
// transactional, and must flush manually (see below). [ProducerOptions]
// returns the options to add. A record is reported published only once
// every in-sync replica has it.
//
// # Order
//
// Records of one key are produced in commit order to one partition (the
// default partitioner hashes the key; an empty key is hashed too, so it
// keeps its order like any other). The idempotent producer keeps a
// partition's order across retries, and when a batch of a partition fails,
// franz-go fails every record buffered behind it in that partition, so a
// later record of the key never lands ahead of an earlier one that failed.
// That holds only if every record of the call is buffered before the first
// is sent: with automatic flushing, a record produced while an earlier one
// of its partition is being failed could be buffered afresh and written
// ahead of it. Hence manual flushing: a call produces all its records, then
// flushes. A record refused before it is buffered (too large for a batch)
// is found before anything is produced, and its key's later records are
// not produced at all ([outbox.ErrNotAttempted]).
//
// # Refused or unreachable
//
// A record is refused ([outbox.IsRefused]) only for its own fault: larger
// than the client's batch limit or the topic's max.message.bytes, an
// invalid record or timestamp for the topic, or a topic that does not exist
// (asked again before it is called missing, since a new or moving topic is
// briefly unknown). When the broker refuses a batch, the batch's records are
// produced again one at a time, so that only the one at fault is refused
// and its neighbours go through. Everything else — a broker that does not
// answer, a leader election that outlasts the retries, missing
// authorization, a closed client — is an outage: the relay retries it and
// parks nothing.
package kafkapub
