// Package natspub publishes outbox records to NATS JetStream: it is the
// [outbox.Publisher] a relay uses to send committed rows to streams.
//
// A record is published to the subject named by its Destination, with its
// ID in the Nats-Msg-Id header (JetStream's publish dedupe key, and what
// an idemnats consumer reads by default), its event time in
// "x-event-time" (RFC 3339 with nanoseconds), and the caller's headers. A
// record is reported published only once the stream's PubAck came back:
// the stream has it (on disk, as the stream's sync settings make it; on
// a quorum of replicas for a replicated stream).
//
// # Dedupe
//
// A relay that publishes a record and loses the PubAck (a timeout, a
// lost connection) publishes it again. Within the stream's duplicate
// window, JetStream drops the second copy by its Nats-Msg-Id; after it,
// the consumer's inbox does. Before the first record to a subject, the
// publisher reads the stream that captures it and refuses (an error
// wrapping [ErrStreamUnsafe], which the relay retries, never parks) a
// stream whose duplicate window is shorter than [Config.MinDuplicateWindow].
//
// # Order
//
// A key's next record is published only once its previous one was
// acknowledged; records of different keys go out together. When a record
// fails, its key's later records of the call are not published
// ([outbox.ErrNotAttempted]).
//
// # Refused or unreachable
//
// A record is refused ([outbox.IsRefused]) for its own fault only: no
// stream captures its subject (checked before its first record), or the
// server refused the message (too large, an expectation that failed). A lost connection and a server
// that does not answer are outages: the relay retries them.
package natspub

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/idembroker"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/outbox"
)

// ErrStreamUnsafe is wrapped by the error of a record whose stream's
// settings could deliver a republished record twice.
var ErrStreamUnsafe = errors.New("stream is unsafe for the outbox relay")

// Config configures a [Publisher]. The zero value is the default.
type Config struct {
	// IDHeader is the header carrying the record's ID. Defaults to
	// "Nats-Msg-Id", which JetStream dedupes on.
	IDHeader string
	// TimeHeader is the header carrying the event time. Defaults to
	// idembroker.HeaderEventTime ("x-event-time").
	TimeHeader string
	// MinDuplicateWindow is the shortest duplicate window a stream may
	// have: how long after a publish whose PubAck was lost the relay may
	// publish the record again and the stream still drop the copy.
	// Defaults to 2 minutes, JetStream's default window.
	MinDuplicateWindow time.Duration
	// Timeout bounds the wait for one wave of PubAcks. Defaults to 10s.
	Timeout time.Duration
}

// Publisher publishes outbox records to JetStream. It implements
// [outbox.Publisher]; it is used by one goroutine at a time.
type Publisher struct {
	js  jetstream.JetStream
	cfg Config

	mu      sync.Mutex
	checked map[string]error // subject → the check of its stream (nil: safe)
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a publisher on js. cfg may be nil. Closing the publisher
// does not close js's connection.
func New(js jetstream.JetStream, cfg *Config) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("natspub: JetStream is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.IDHeader == "" {
		c.IDHeader = jetstream.MsgIDHeader
	}
	if c.TimeHeader == "" {
		c.TimeHeader = idembroker.HeaderEventTime
	}
	if c.IDHeader == c.TimeHeader {
		return nil, fmt.Errorf("natspub: IDHeader and TimeHeader are both %q", c.IDHeader)
	}
	if c.MinDuplicateWindow == 0 {
		c.MinDuplicateWindow = 2 * time.Minute
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	return &Publisher{js: js, cfg: c, checked: map[string]error{}}, nil
}

// Close does nothing: the connection stays the caller's to close.
func (p *Publisher) Close() error { return nil }

// Publish publishes recs and returns, per record, nil once the stream
// acknowledged it, an error for which outbox.IsRefused is true when the
// record itself was refused, [outbox.ErrNotAttempted] for a record not
// published because an earlier one of its key failed, or another error
// for an outage, an unsafe stream, or ctx done before the record's fate
// was known.
func (p *Publisher) Publish(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	failed := map[string]bool{}
	// Waves: the n-th record of every key goes in wave n.
	var waves [][]int
	seen := map[string]int{}
	for i := range recs {
		n := seen[recs[i].Key]
		seen[recs[i].Key] = n + 1
		for len(waves) <= n {
			waves = append(waves, nil)
		}
		waves[n] = append(waves[n], i)
	}
	for _, wave := range waves {
		type sent struct {
			i   int
			ack jetstream.PubAckFuture
		}
		var out []sent
		for _, i := range wave {
			r := &recs[i]
			if failed[r.Key] {
				errs[i] = outbox.ErrNotAttempted
				continue
			}
			if err := p.check(ctx, r.Destination); err != nil {
				errs[i] = err
				failed[r.Key] = true
				continue
			}
			f, err := p.js.PublishMsgAsync(p.msg(r))
			if err != nil {
				errs[i] = classify(err)
				failed[r.Key] = true
				continue
			}
			out = append(out, sent{i, f})
		}
		timeout := time.NewTimer(p.cfg.Timeout)
		for _, s := range out {
			var err error
			select {
			case <-s.ack.Ok():
			case err = <-s.ack.Err():
				err = classify(err)
			case <-ctx.Done():
				err = ctx.Err()
			case <-timeout.C:
				err = fmt.Errorf("no PubAck within %v: %w", p.cfg.Timeout, nats.ErrTimeout)
				timeout.Reset(0)
			}
			if err != nil {
				errs[s.i] = err
				failed[recs[s.i].Key] = true
			}
		}
		timeout.Stop()
	}
	return errs
}

// msg builds the message of r.
func (p *Publisher) msg(r *outbox.Record) *nats.Msg {
	h := make(nats.Header, len(r.Headers)+2)
	for k, v := range r.Headers {
		h.Set(k, v)
	}
	h.Set(p.cfg.IDHeader, r.ID)
	if p.cfg.IDHeader != jetstream.MsgIDHeader {
		h.Set(jetstream.MsgIDHeader, r.ID)
	}
	if !r.EventTime.IsZero() {
		h.Set(p.cfg.TimeHeader, r.EventTime.UTC().Format(time.RFC3339Nano))
	}
	return &nats.Msg{Subject: r.Destination, Header: h, Data: r.Body}
}

// check reads, once per subject, the stream that captures subject and
// refuses one whose duplicate window is too short. A subject no stream
// captures is refused; a check the server did not answer is tried again
// at the next record.
func (p *Publisher) check(ctx context.Context, subject string) error {
	p.mu.Lock()
	err, ok := p.checked[subject]
	p.mu.Unlock()
	if ok {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	name, err := p.js.StreamNameBySubject(cctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = outbox.Refused(fmt.Errorf("no stream captures subject %q: %w", subject, err))
	} else if err == nil {
		var s jetstream.Stream
		if s, err = p.js.Stream(cctx, name); err == nil {
			if w := s.CachedInfo().Config.Duplicates; w < p.cfg.MinDuplicateWindow {
				err = fmt.Errorf("%w: stream %s drops a republished record only within its duplicate window %v, shorter than MinDuplicateWindow %v: raise the stream's duplicate window",
					ErrStreamUnsafe, name, w, p.cfg.MinDuplicateWindow)
			}
		}
	}
	if err != nil && !outbox.IsRefused(err) && !errors.Is(err, ErrStreamUnsafe) {
		return fmt.Errorf("reading the stream of %q: %w", subject, err)
	}
	p.mu.Lock()
	p.checked[subject] = err
	p.mu.Unlock()
	return err
}

// classify marks the server refusing a message as refused; anything else
// is an outage. No responders is an outage too: the stream was found
// before the first record, and a stream whose leader is being elected
// does not answer for a moment.
func classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload), errors.As(err, &apiErr):
		return outbox.Refused(err)
	}
	return err
}
