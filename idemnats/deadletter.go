package idemnats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// deadLetterWindow is the duplicate window of a dead-letter stream Run
// creates: a message whose Term was lost comes back within AckWait and
// is dead-lettered again; the stream keeps one copy.
const deadLetterWindow = 2 * time.Minute

// ensureDeadLetters checks that the dead-letter stream exists and captures
// the dead-letter subject, creating it when allowed with the storage and
// replicas of src.
func (c *Consumer[TTx]) ensureDeadLetters(ctx context.Context, js jetstream.JetStream, src *jetstream.StreamInfo) error {
	cfg := &c.cfg
	s, err := js.Stream(ctx, cfg.DeadLetterStream)
	switch {
	case err == nil:
		subjects := s.CachedInfo().Config.Subjects
		for _, f := range subjects {
			if subjectMatches(f, cfg.DeadLetterSubject) {
				return c.checkRetention(&s.CachedInfo().Config, "dead-letter ")
			}
		}
		return fmt.Errorf("%w: stream %s captures %v, not the dead-letter subject %s", ErrNoDeadLetterDestination, cfg.DeadLetterStream, subjects, cfg.DeadLetterSubject)
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: checking stream %s: %w", ErrNoDeadLetterDestination, cfg.DeadLetterStream, err)
	case !cfg.CreateDeadLetterStream:
		return fmt.Errorf("%w: stream %s, the dead-letter stream of %s, does not exist: create it capturing %s (with the replicas of %s), or set idemnats.Config.CreateDeadLetterStream",
			ErrNoDeadLetterDestination, cfg.DeadLetterStream, cfg.Stream, cfg.DeadLetterSubject, cfg.Stream)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.DeadLetterStream,
		Description: "idem dead letters of stream " + cfg.Stream,
		Subjects:    []string{cfg.DeadLetterSubject},
		Storage:     src.Config.Storage,
		Replicas:    src.Config.Replicas,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  deadLetterWindow,
		// As long as the inbox can tell a redriven letter from one
		// applied before.
		MaxAge: max(c.proc.Window(), 0),
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("%w: creating stream %s: %w", ErrNoDeadLetterDestination, cfg.DeadLetterStream, err)
	}
	c.cfg.Logger.Info("dead-letter stream created", "stream", cfg.DeadLetterStream, "subject", cfg.DeadLetterSubject)
	return nil
}

// subjectMatches reports whether the subject filter f (with * and >
// wildcards) matches subject s.
func subjectMatches(f, s string) bool {
	ft, st := strings.Split(f, "."), strings.Split(s, ".")
	for i, t := range ft {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) || t != "*" && t != st[i] {
			return false
		}
	}
	return len(ft) == len(st)
}

// origin names a message the way [idembroker.HeaderOrigin] does on
// JetStream: stream/sequence.
func origin(stream string, m jetstream.Msg) string {
	if md, err := m.Metadata(); err == nil {
		return stream + "/" + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	return stream + "/?"
}

// expectedPrefix begins the headers of JetStream's publish expectations
// (Nats-Expected-Stream, Nats-Expected-Last-Subject-Sequence), which a
// stream stores with the message: they were meant for the original
// publish, and would make the dead letter's publish, or a redrive, fail.
const expectedPrefix = "Nats-Expected-"

// deadLetterMsg copies m for the dead-letter subject: its data and
// headers (the ID, the event time and the trace context survive for a
// replay), its envelope ([idembroker.Envelope]: why, who, how often, from
// where) and the subject it was published to ([HeaderSubject]), where a
// redrive sends it back. A message without a time header whose event
// time was the time the stream stored it gets that time in the time
// header, so that a redrive keeps it; a header that is there, read or not,
// is kept as the producer wrote it.
func (c *Consumer[TTx]) deadLetterMsg(m jetstream.Msg, d decision) *nats.Msg {
	h := nats.Header{}
	for k, v := range m.Headers() {
		if !strings.HasPrefix(k, expectedPrefix) {
			h[k] = append([]string(nil), v...)
		}
	}
	from := origin(c.cfg.Stream, m)
	idembroker.NewEnvelope(c.proc.Consumer(), from, d.res, d.disp).Write(
		func(k, v string) { h.Set(k, v) },
		func(k string, n int64) { h.Set(k, strconv.FormatInt(n, 10)) })
	h.Set(HeaderSubject, m.Subject())
	if im := Message(m, c.cfg.Stream, c.cfg.IDHeader, c.cfg.TimeHeader); im.TimeSource == idem.TimeFromBroker && h.Get(c.cfg.TimeHeader) == "" {
		// The time the stream stored the original, which a redrive's
		// republish would replace: the horizon guard reads it from the
		// header when the letter comes back.
		h.Set(c.cfg.TimeHeader, im.Time.UTC().Format(time.RFC3339Nano))
	}
	if h.Get(jetstream.MsgIDHeader) == "" {
		// The stream's dedupe key: a message whose Term was lost comes
		// back and is dead-lettered again, into the same copy.
		h.Set(jetstream.MsgIDHeader, from)
	}
	return &nats.Msg{Subject: c.cfg.DeadLetterSubject, Header: h, Data: m.Data()}
}

// deadLetter publishes m's dead letter and waits for the dead-letter
// stream's PubAck, trying again with backoff while ctx lives: terminating
// a message that is in neither the database nor the dead-letter stream
// would lose it. The caller keeps the message alive with heartbeats
// meanwhile.
func (c *Consumer[TTx]) deadLetter(ctx context.Context, js jetstream.JetStream, m jetstream.Msg, d decision) error {
	dl := c.deadLetterMsg(m, d)
	for try := 1; ; try++ {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.PublishMsg(pctx, dl, jetstream.WithExpectStream(c.cfg.DeadLetterStream))
		cancel()
		c.settler.DeadLetter(c.cfg.DeadLetterStream, d.res, err)
		if err == nil {
			return nil
		}
		c.health.Fail(fmt.Errorf("publishing dead letter: %w", err), time.Now())
		c.cfg.Logger.Error("publishing dead letter failed; the message is kept and published again",
			"consumer", c.proc.Consumer(), "origin", dl.Header.Get(idembroker.HeaderOrigin), "dead_letter_stream", c.cfg.DeadLetterStream, "error", err)
		if err := sleep(ctx, c.cfg.Backoff.Delay(try)); err != nil {
			return fmt.Errorf("publishing dead letter to %s: %w", c.cfg.DeadLetterStream, err)
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
