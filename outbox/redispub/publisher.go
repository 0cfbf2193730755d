// Package redispub publishes outbox records to Redis streams with
// go-redis: it is the [outbox.Publisher] a relay uses to send committed
// rows to streams that idemredis consumers read.
//
// A record is one XADD to the stream named by its Destination, with the
// fields an idemredis consumer reads by default: its ID in
// "idem-message-id" (idemredis.DefaultIDField), its event time in
// "x-event-time" ([idembroker.HeaderEventTime], RFC 3339, UTC), its Key in
// "key" and its Body in "body", next to the caller's headers. The entry ID
// is Redis's.
//
// # Durability
//
// A record is reported published once Redis answered its XADD, and, with
// Config.Replicas, once that many replicas have it (WAIT, sent in the
// pipeline of the writes: give the publisher a *redis.Client). [New] refuses a
// server that answers writes it may forget (appendonly no, or appendfsync
// other than always): the row would be marked sent and the entry lost by
// a crash. Config.AcceptUnsyncedWrites accepts it knowingly. A server that
// refuses CONFIG (a managed service) is not refused.
//
// # Order and refusals
//
// The records of one call go in commit order on one connection, in one
// pipeline, so the records of a key land in their order. A record to a
// stream that does not exist is refused (the relay parks it) rather than
// creating a stream no group reads, unless Config.CreateStreams is set;
// the streams are checked before anything is sent, and the later records
// of a refused record's key are not attempted.
package redispub

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/idembroker"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/outbox"
)

// ErrUnsafe is wrapped by the error [New] returns for a server whose
// settings could lose an entry it answered.
var ErrUnsafe = errors.New("redis server is unsafe for the outbox relay")

// Config configures a [Publisher]. The zero value is the default.
type Config struct {
	// IDField carries the record's ID. Defaults to
	// idemredis.DefaultIDField ("idem-message-id"); set it to the
	// consumers' idemredis.Config.IDField if they read another.
	IDField string
	// TimeField carries the event time. Defaults to idembroker.HeaderEventTime.
	TimeField string
	// BodyField and KeyField carry the body and the key. Default to
	// idemredis.DefaultBodyField and idemredis.DefaultKeyField.
	BodyField, KeyField string
	// CreateStreams lets an XADD create a missing stream. Defaults to
	// false: a record to a missing stream is refused.
	CreateStreams bool
	// Replicas, when positive, makes every call wait (WAIT) until that many
	// replicas have its entries, for at most ReplicaTimeout (default 5s);
	// fewer is an error, and the records are published again.
	Replicas       int
	ReplicaTimeout time.Duration
	// AcceptUnsyncedWrites accepts a server with appendonly no or an
	// appendfsync other than always, which can lose entries it answered.
	AcceptUnsyncedWrites bool
}

// Publisher writes outbox records to Redis streams. It implements
// [outbox.Publisher]; it is used by one goroutine at a time.
type Publisher struct {
	rdb redis.UniversalClient
	cfg Config
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a publisher writing with rdb, or an error wrapping
// [ErrUnsafe] naming the server settings that could lose an entry. cfg may
// be nil. Closing the publisher does not close rdb.
func New(ctx context.Context, rdb redis.UniversalClient, cfg *Config) (*Publisher, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: the client is nil", ErrUnsafe)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.IDField, idemredis.DefaultIDField)
	def(&c.TimeField, idembroker.HeaderEventTime)
	def(&c.BodyField, idemredis.DefaultBodyField)
	def(&c.KeyField, idemredis.DefaultKeyField)
	if c.ReplicaTimeout <= 0 {
		c.ReplicaTimeout = 5 * time.Second
	}
	names := map[string]bool{}
	for _, f := range []string{c.IDField, c.TimeField, c.BodyField, c.KeyField} {
		if names[f] {
			return nil, fmt.Errorf("redispub: field %q is given two roles", f)
		}
		names[f] = true
	}
	if !c.AcceptUnsyncedWrites {
		if settings, err := rdb.ConfigGet(ctx, "append*").Result(); err == nil {
			switch {
			case settings["appendonly"] == "no":
				return nil, fmt.Errorf("%w: appendonly is no, so a restart loses the entries written since the last snapshot, after their rows were marked sent: set appendonly yes and appendfsync always, or Config.AcceptUnsyncedWrites", ErrUnsafe)
			case settings["appendfsync"] != "" && settings["appendfsync"] != "always":
				return nil, fmt.Errorf("%w: appendfsync is %s, so a crash loses up to a second of entries after their rows were marked sent: set appendfsync always, or Config.AcceptUnsyncedWrites", ErrUnsafe, settings["appendfsync"])
			}
		}
	}
	return &Publisher{rdb: rdb, cfg: c}, nil
}

// Close does nothing: the client stays the caller's to close.
func (p *Publisher) Close() error { return nil }

// Publish writes recs and returns, per record, nil once Redis has it (and
// the replicas asked for), an error for which outbox.IsRefused is true
// when the record itself was refused (its stream missing or of another
// type, a header on a reserved field), [outbox.ErrNotAttempted] for a
// record not written because an earlier one of its key failed, or another
// error for an outage.
func (p *Publisher) Publish(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	missing := map[string]bool{}
	if !p.cfg.CreateStreams {
		var err error
		if missing, err = p.missing(ctx, recs); err != nil {
			for i := range errs {
				errs[i] = err
			}
			return errs
		}
	}
	failed := map[string]bool{} // keys with a failed record
	cmds := make([]*redis.StringCmd, len(recs))
	var wait *redis.Cmd
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i := range recs {
			r := &recs[i]
			switch {
			case failed[r.Key]:
				errs[i] = outbox.ErrNotAttempted
				continue
			case missing[r.Destination]:
				errs[i] = outbox.Refused(fmt.Errorf("redispub: stream %q does not exist (create it, or set Config.CreateStreams)", r.Destination))
				failed[r.Key] = true
				continue
			}
			values, err := p.values(r)
			if err != nil {
				errs[i] = outbox.Refused(err)
				failed[r.Key] = true
				continue
			}
			cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: r.Destination, NoMkStream: !p.cfg.CreateStreams, Values: values})
		}
		if p.cfg.Replicas > 0 {
			// On the connection of the writes: WAIT counts those.
			wait = pipe.Do(ctx, "WAIT", p.cfg.Replicas, p.cfg.ReplicaTimeout.Milliseconds())
		}
		return nil
	})
	written := 0
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		err := cmd.Err()
		var re redis.Error
		switch {
		case errors.Is(err, redis.Nil):
			err = outbox.Refused(fmt.Errorf("redispub: stream %q was deleted", recs[i].Destination))
		case errors.As(err, &re):
			// An error reply about this command (WRONGTYPE, a field the
			// server refuses): the record's own fault.
			err = outbox.Refused(fmt.Errorf("redispub: XADD to %q: %w", recs[i].Destination, err))
		case err == nil:
			written++
		}
		errs[i] = err
	}
	if written > 0 && p.cfg.Replicas > 0 {
		n, err := wait.Int64()
		if err == nil && n < int64(p.cfg.Replicas) {
			err = fmt.Errorf("redispub: %d of %d replicas acknowledged the entries within %v", n, p.cfg.Replicas, p.cfg.ReplicaTimeout)
		}
		if err != nil {
			for i := range errs {
				if cmds[i] != nil && errs[i] == nil {
					errs[i] = err
				}
			}
		}
	}
	return errs
}

// missing returns the destinations of recs that do not exist.
func (p *Publisher) missing(ctx context.Context, recs []outbox.Record) (map[string]bool, error) {
	dests := map[string]*redis.IntCmd{}
	_, err := p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, r := range recs {
			if _, ok := dests[r.Destination]; !ok {
				dests[r.Destination] = pipe.Exists(ctx, r.Destination)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redispub: checking streams: %w", err)
	}
	out := map[string]bool{}
	for d, cmd := range dests {
		if cmd.Val() == 0 {
			out[d] = true
		}
	}
	return out, nil
}

// values are the fields of r's entry.
func (p *Publisher) values(r *outbox.Record) ([]any, error) {
	v := make([]any, 0, 8+2*len(r.Headers))
	for k, h := range r.Headers {
		switch k {
		case p.cfg.IDField, p.cfg.TimeField, p.cfg.BodyField, p.cfg.KeyField:
			return nil, fmt.Errorf("redispub: header %q is a field the publisher sets", k)
		}
		v = append(v, k, h)
	}
	v = append(v, p.cfg.IDField, r.ID, p.cfg.BodyField, r.Body)
	if !r.EventTime.IsZero() {
		v = append(v, p.cfg.TimeField, r.EventTime.UTC().Format(time.RFC3339Nano))
	}
	if r.Key != "" {
		v = append(v, p.cfg.KeyField, r.Key)
	}
	return v, nil
}
