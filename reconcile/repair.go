package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/outbox"
)

// ErrNoPayload is returned by [Repair] for a report whose source carries
// no payloads (an ID file): there is nothing to redeliver from.
var ErrNoPayload = errors.New("reconcile: the source carries no payloads (an ID file): repair is refused; redeliver the missing messages from their producer, or reconcile against an outbox or a Kafka topic")

// RepairConfig says where and how [Repair] redelivers.
type RepairConfig struct {
	// Publisher sends each message and returns once the broker confirmed
	// it: outbox/amqppub (RabbitMQ, publisher confirms, mandatory) or
	// outbox/kafkapub (Kafka, acks from every in-sync replica). Required.
	Publisher outbox.Publisher
	// Destination and RoutingKey are where the messages go: the
	// consumer's own queue (Destination "", RoutingKey the queue, through
	// RabbitMQ's default exchange) or topic (Destination the topic), so
	// that no other consumer receives them again.
	Destination, RoutingKey string
	// Rate bounds the redeliveries per second. Defaults to 100.
	Rate float64
	// Logger logs each redelivery. Defaults to slog.Default().
	Logger *slog.Logger
}

// Repaired is the result of [Repair].
type Repaired struct {
	Consumer string `json:"consumer"`
	// Sent are the IDs the broker confirmed, in order.
	Sent []string `json:"sent"`
	// Failed is the ID whose redelivery failed and stopped the repair
	// (empty when none); the IDs after it were not sent.
	Failed string `json:"failed,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Repair redelivers exactly the missing messages of rep, one at a time,
// each confirmed by the broker before the next, at most cfg.Rate a second.
// The consumer's inbox then applies each once; a message the consumer
// applied meanwhile meets its marker and is a duplicate, so a repair run
// twice doubles nothing. It stops at the first failure, with what it sent
// so far and the error.
func Repair(ctx context.Context, rep *Report, cfg RepairConfig) (Repaired, error) {
	out := Repaired{Consumer: rep.Consumer, Sent: []string{}}
	if !rep.Payloads {
		return out, ErrNoPayload
	}
	if cfg.Publisher == nil {
		return out, errors.New("reconcile: RepairConfig.Publisher is required")
	}
	if cfg.Destination == "" && cfg.RoutingKey == "" {
		return out, errors.New("reconcile: name the consumer's queue (RoutingKey) or topic (Destination) to redeliver to")
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 100
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	every := time.Duration(float64(time.Second) / cfg.Rate)
	var next time.Time
	for _, f := range rep.Missing {
		if f.Record == nil {
			return out, fmt.Errorf("%w (message %s)", ErrNoPayload, f.ID)
		}
		if wait := time.Until(next); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return out, ctx.Err()
			case <-t.C:
			}
		}
		next = time.Now().Add(every)
		rec := *f.Record
		rec.Destination, rec.RoutingKey = cfg.Destination, cfg.RoutingKey
		if err := cfg.Publisher.Publish(ctx, []outbox.Record{rec})[0]; err != nil {
			out.Failed, out.Error = f.ID, err.Error()
			log.Error("reconcile: redelivery failed", "consumer", rep.Consumer, "id", f.ID, "destination", cfg.Destination, "routing_key", cfg.RoutingKey, "err", err)
			return out, fmt.Errorf("reconcile: redelivering %s: %w", f.ID, err)
		}
		out.Sent = append(out.Sent, f.ID)
		log.Info("reconcile: redelivered", "consumer", rep.Consumer, "id", f.ID, "time", f.Time, "position", f.Position, "destination", cfg.Destination, "routing_key", cfg.RoutingKey)
	}
	return out, nil
}
