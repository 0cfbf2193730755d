package idembroker

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/logfmt"
)

// Health is what a broker consumer reports about itself, for a readiness
// probe, a liveness probe and a status page. The adapters
// (idemrabbitmq.Consumer.Health, idemkafka.Consumer.Health) keep it from
// what they see while they run: reading it touches neither the broker nor
// the database.
type Health struct {
	// Consumer is the processor's consumer name; Source the queue, or the
	// topics joined by commas.
	Consumer string `json:"consumer"`
	Source   string `json:"source"`
	// Running is set while Run runs; Started is when it began.
	Running bool      `json:"running"`
	Started time.Time `json:"started,omitzero"`
	// Connected is set while the broker session is up: RabbitMQ, the
	// consuming channel is open; Kafka, the client is a member of its
	// group and its last poll did not fail. ConnectedSince is when it came
	// up.
	Connected      bool      `json:"connected"`
	ConnectedSince time.Time `json:"connected_since,omitzero"`
	// Holding is set while messages are held because the inbox database
	// is unreachable or not set up for the consumer: they are kept, not
	// dead-lettered, and tried again. It is set when the processor gives
	// a message up as held (after its RetryPolicy.WaitUnavailable), or
	// when the check at start cannot reach the database, and cleared by
	// the next message acked. HoldingSince is when it began; HoldReason
	// is the error that began it.
	Holding      bool      `json:"holding"`
	HoldingSince time.Time `json:"holding_since,omitzero"`
	HoldReason   string    `json:"hold_reason,omitempty"`
	// Paused is set while messages are held because an operator paused
	// the consumer (`idem consumer pause`): set when a message is held
	// for it, cleared by the next message acked once it is resumed.
	// PausedSince, PausedBy and PauseReason are the pause's when, who and
	// why. A paused consumer is ready and alive: it holds by design.
	Paused      bool      `json:"paused,omitempty"`
	PausedSince time.Time `json:"paused_since,omitzero"`
	PausedBy    string    `json:"paused_by,omitempty"`
	PauseReason string    `json:"pause_reason,omitempty"`
	// LastSuccess is when a message was last acked (applied or a
	// duplicate) or durably dead-lettered.
	LastSuccess time.Time `json:"last_success,omitzero"`
	// LastError is the last failure the consumer met (a lost session, a
	// message given back, a failed offset commit), and LastErrorAt when.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// BusySince is set while batches are in the database: when the oldest
	// of them started. A time further back than [StallAfter] means a batch
	// has not come back for that long: the consumer (or one of its Kafka
	// partitions) is wedged, however many other batches come and go.
	BusySince time.Time `json:"busy_since,omitzero"`
	// Reconnects counts broker sessions that ended while Run went on
	// (RabbitMQ).
	Reconnects uint64 `json:"reconnects,omitempty"`
	// InFlight counts deliveries received and not yet settled at the
	// broker (RabbitMQ; at most the prefetch).
	InFlight int `json:"in_flight,omitempty"`
	// Lag is, for each partition the consumer holds (Kafka), how far its
	// committed offset is behind the partition's end; TotalLag is their
	// sum.
	Lag      []PartitionLag `json:"lag,omitempty"`
	TotalLag int64          `json:"total_lag,omitempty"`
}

// PartitionLag is one Kafka partition's lag: HighWatermark, the offset
// after its last record as of the last fetch, minus Committed, the offset
// the group resumes from.
type PartitionLag struct {
	Topic         string `json:"topic"`
	Partition     int32  `json:"partition"`
	HighWatermark int64  `json:"high_watermark"`
	Committed     int64  `json:"committed"`
	Lag           int64  `json:"lag"`
}

// StallAfter is how long batches may be in the database without one of
// them coming back before [Health.Live] calls the consumer wedged. It is
// longer than the processor's default RetryPolicy.WaitUnavailable (1
// minute), after which an outage comes back as held messages. A processor
// whose WaitUnavailable is -1 waits an outage out inside the batch, and so
// looks wedged once the outage is older than StallAfter.
const StallAfter = 5 * time.Minute

// ErrNotReady is wrapped by the errors of [Health.Ready] and [Health.Live].
var ErrNotReady = errors.New("consumer not ready")

// Ready returns nil when the consumer takes and settles messages: it
// runs, its broker session is up and it holds no messages for an outage.
// Otherwise the error, wrapping [ErrNotReady], says which and why.
func (h Health) Ready() error {
	switch {
	case !h.Running:
		return fmt.Errorf("%w: consumer %s is not running", ErrNotReady, h.Consumer)
	case h.Holding:
		return fmt.Errorf("%w: consumer %s is holding messages since %s, the inbox database is unreachable or not set up: %s",
			ErrNotReady, h.Consumer, h.HoldingSince.UTC().Format(time.RFC3339), h.HoldReason)
	case !h.Connected:
		why := ""
		if h.LastError != "" {
			why = ": last error: " + h.LastError
		}
		return fmt.Errorf("%w: consumer %s is not connected to the broker (%s)%s", ErrNotReady, h.Consumer, h.Source, why)
	}
	return nil
}

// Live returns nil while the consumer's Run loop is alive at now: it
// runs, and no batch has been in the database for longer than
// [StallAfter] without one coming back. A consumer holding messages for an
// outage, or reconnecting to its broker, is alive: restarting it would
// not help. Otherwise the error wraps [ErrNotReady].
func (h Health) Live(now time.Time) error {
	switch {
	case !h.Running:
		return fmt.Errorf("%w: consumer %s is not running", ErrNotReady, h.Consumer)
	case !h.BusySince.IsZero() && now.Sub(h.BusySince) > StallAfter:
		return fmt.Errorf("%w: consumer %s is wedged: no batch has come back from the database since %s",
			ErrNotReady, h.Consumer, h.BusySince.UTC().Format(time.RFC3339))
	}
	return nil
}

// HealthChecker is what the health handlers read: a consumer of package
// idemrabbitmq or idemkafka.
type HealthChecker interface {
	Health() Health
}

// HandleHealth registers on mux, in one line, the liveness probe at
// /healthz and the readiness probe at /readyz for the consumers cs (see
// [LiveHandler], [ReadyHandler]).
func HandleHealth(mux *http.ServeMux, cs ...HealthChecker) {
	mux.Handle("/healthz", LiveHandler(cs...))
	mux.Handle("/readyz", ReadyHandler(cs...))
}

// ReadyHandler answers 200 when every consumer of cs is ready
// ([Health.Ready]) and 503 when one is not, with a JSON body that carries
// each consumer's health and, when not ready, why:
//
//	{"status":"unavailable","errors":["consumer not ready: consumer billing is holding messages since …"],"consumers":[{…}]}
func ReadyHandler(cs ...HealthChecker) http.Handler {
	return healthHandler(cs, func(h Health) error { return h.Ready() })
}

// LiveHandler answers 200 while every consumer of cs is alive
// ([Health.Live]) and 503 when one is not, with the same JSON body as
// [ReadyHandler].
func LiveHandler(cs ...HealthChecker) http.Handler {
	return healthHandler(cs, func(h Health) error { return h.Live(time.Now()) })
}

type healthBody struct {
	Status    string   `json:"status"`
	Errors    []string `json:"errors,omitempty"`
	Consumers []Health `json:"consumers"`
}

func healthHandler(cs []HealthChecker, check func(Health) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		body := healthBody{Status: "ok", Consumers: make([]Health, 0, len(cs))}
		for _, c := range cs {
			h := c.Health()
			if err := check(h); err != nil {
				// One line per distinct error: the reason already in the
				// error is not repeated in the consumer's fields.
				msg := logfmt.OneLine(err.Error())
				if !slices.Contains(body.Errors, msg) {
					body.Errors = append(body.Errors, msg)
				}
				if h.HoldReason != "" && strings.Contains(msg, h.HoldReason) {
					h.HoldReason = ""
				}
				if h.LastError != "" && strings.Contains(msg, h.LastError) {
					h.LastError = ""
				}
			}
			body.Consumers = append(body.Consumers, h)
		}
		code := http.StatusOK
		if len(body.Errors) > 0 {
			body.Status, code = "unavailable", http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}

// HealthState keeps a consumer's [Health] from the events of its run. The
// broker adapters hold one each and call its methods where the events
// happen; an adapter of one's own can do the same. It is safe for
// concurrent use; every method takes the time of the event.
type HealthState struct {
	mu   sync.Mutex
	log  *slog.Logger
	held map[string]struct{} // the messages held in the current hold
	h    Health
	busy map[uint64]time.Time // the batches in the database, by Begin's token: when each started
	next uint64               // the last token given
}

// NewHealthState returns the state of a consumer that has not started.
func NewHealthState(consumer, source string) *HealthState {
	return &HealthState{h: Health{Consumer: consumer, Source: source}}
}

// LogTo makes the state log, on l, the end of each hold for an outage:
// how long the inbox database was away and how many messages were held.
func (s *HealthState) LogTo(l *slog.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = logfmt.Wrap(l)
}

// maxHeldCounted bounds the messages a hold remembers to count them.
const maxHeldCounted = 100_000

// endHold ends a hold for an outage at now, and logs it.
func (s *HealthState) endHold(now time.Time) {
	if s.h.Holding && s.log != nil {
		down := now.Sub(s.h.HoldingSince).Round(100 * time.Millisecond)
		s.log.Info(fmt.Sprintf("database back after %s, %d held messages go through again", down, len(s.held)),
			slog.String("consumer", s.h.Consumer), slog.Duration("outage", down), slog.Int("held_messages", len(s.held)), slog.String("hold_reason", s.h.HoldReason))
	}
	s.h.Holding, s.h.HoldingSince, s.h.HoldReason = false, time.Time{}, ""
	s.held = nil
}

// Health returns the state as of the last event.
func (s *HealthState) Health() Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.h
}

// Start records that Run began.
func (s *HealthState) Start(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h.Running, s.h.Started = true, now
}

// Stop records that Run returned: the consumer is neither running nor
// connected, and holds nothing.
func (s *HealthState) Stop(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h.Running, s.h.Connected, s.h.ConnectedSince = false, false, time.Time{}
	s.h.Holding, s.h.HoldingSince, s.h.HoldReason = false, time.Time{}, ""
	s.h.BusySince, s.busy = time.Time{}, nil
}

// Connect records that the broker session is up.
func (s *HealthState) Connect(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.h.Connected {
		s.h.Connected, s.h.ConnectedSince = true, now
	}
}

// Disconnect records that the broker session ended, with err (nil: for a
// shutdown).
func (s *HealthState) Disconnect(err error, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h.Connected, s.h.ConnectedSince = false, time.Time{}
	if err != nil {
		s.failed(err, now)
	}
}

// Fail records a failure that does not end the session.
func (s *HealthState) Fail(err error, now time.Time) {
	if err == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed(err, now)
}

func (s *HealthState) failed(err error, now time.Time) {
	s.h.LastError, s.h.LastErrorAt = logfmt.OneLine(err.Error()), now
}

// Unreachable records that the inbox database could not be used at all
// (the check before the first message failed with err): the consumer
// holds its messages until a message is acked.
func (s *HealthState) Unreachable(err error, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold(err.Error(), now)
	s.failed(err, now)
}

// Reachable records that the inbox database answered (the check before
// the first message passed): a hold that [HealthState.Unreachable] began
// ends.
func (s *HealthState) Reachable(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endHold(now)
}

func (s *HealthState) hold(reason string, now time.Time) {
	if !s.h.Holding {
		s.h.Holding, s.h.HoldingSince = true, now
	}
	s.h.HoldReason = logfmt.OneLine(reason)
}

// Settle records the disposition d of result r once the adapter carried
// it out: an ack ends a hold and, like a dead letter, counts as a
// success; a hold for an outage or a misconfigured inbox (r.Err wraps
// [idem.ErrUnavailable], [idem.ErrMisconfigured] or [idem.ErrInboxNotReady]) begins or
// continues one; a hold of a paused consumer ([idem.ErrPaused]) sets
// Health.Paused; a redelivery is a failure. A hold for any other reason
// (a shutdown, a message ahead of it in order) changes nothing.
func (s *HealthState) Settle(d idem.Disposition, r idem.Result, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch d.Action {
	case idem.ActionAck:
		s.h.LastSuccess = now
		s.endHold(now)
		s.h.Paused, s.h.PausedSince, s.h.PausedBy, s.h.PauseReason = false, time.Time{}, "", ""
	case idem.ActionDeadLetter:
		s.h.LastSuccess = now
	case idem.ActionHold:
		if pe := (*idem.PausedError)(nil); errors.As(r.Err, &pe) {
			s.h.Paused, s.h.PausedSince, s.h.PausedBy, s.h.PauseReason = true, pe.Since, pe.By, pe.Why
		}
		if outage(r.Err) {
			s.hold(d.Reason, now)
			s.failed(r.Err, now)
			if s.held == nil {
				s.held = map[string]struct{}{}
			}
			if len(s.held) < maxHeldCounted {
				s.held[r.MessageID] = struct{}{}
			}
		}
	case idem.ActionRedeliver:
		if r.Err != nil {
			s.failed(r.Err, now)
		}
	}
}

// outage reports whether err keeps a message from the inbox for no fault
// of its own that a probe should see: the database unreachable or not set
// up for the consumer.
func outage(err error) bool {
	return errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrMisconfigured) || errors.Is(err, idem.ErrInboxNotReady)
}

// Begin records that a batch went to the database; End takes the token it
// returns when the batch comes back.
func (s *HealthState) Begin(now time.Time) (token uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy == nil {
		s.busy = map[uint64]time.Time{}
	}
	s.next++
	s.busy[s.next] = now
	s.busySince()
	return s.next
}

// End records that the batch Begin gave token for came back from the
// database.
func (s *HealthState) End(token uint64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.busy, token)
	s.busySince()
}

// busySince sets BusySince to the start of the oldest batch in the
// database (zero when none is).
func (s *HealthState) busySince() {
	var oldest time.Time
	for _, t := range s.busy {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	s.h.BusySince = oldest
}
