package dlq

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
	"github.com/idemkit/idem/idemnats"
)

// NATSConfig names a JetStream dead-letter stream.
type NATSConfig struct {
	// URL is the server URL, or several comma-separated. Required.
	URL string
	// Options are further connection options (credentials, TLS).
	Options []nats.Option
	// Stream is the dead-letter stream ("BILLING_DLQ", as idemnats fills
	// it). Required.
	Stream string
	// IDHeader is the header with the message ID (idemnats.Config.IDHeader).
	// Defaults to "Nats-Msg-Id".
	IDHeader string
	// TimeHeader is the producer's event-time header
	// (idemnats.Config.TimeHeader). Defaults to "x-event-time".
	TimeHeader string
	// Target is the subject letters that name none are redriven to. Empty:
	// such letters are refused.
	Target string
}

// NATS is a dead-letter stream on NATS JetStream.
//
// Reading is free: a read gets each message of the stream by its sequence
// (the stream's message-get API), through no consumer, so no list, show or
// dry run delivers, acknowledges or moves anything. A letter leaves the
// stream only when a redrive or purge deletes it by its sequence: a
// redrive first publishes it to its subject (the x-idem-subject header)
// and waits for the PubAck of the stream that captures it.
//
// A redrive keeps the letter's headers, Nats-Msg-Id among them, minus the
// dead-letter ones and JetStream's publish expectations (Nats-Expected-*),
// plus x-idem-redriven. So the stream it goes back to
// dedupes it against the original within its duplicate window (2 minutes
// by default): such a publish is answered as a duplicate and stored
// nowhere, and the original was terminated. The redrive treats that answer
// as a failure: the letter stays, and the walk stops with an error that
// says to redrive it once the window has passed. (A new Nats-Msg-Id would
// pass the dedupe, but the consumer's inbox key is the message ID: the
// message would no longer be the same message.) A letter whose
// Nats-Msg-Id is the dedupe key the consumer gave a message without one
// (its origin, stream/sequence) is redriven without it, and, when the ID
// is read from Nats-Msg-Id, read with no ID.
type NATS struct {
	cfg    NATSConfig
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
}

// NewNATS connects to the server and checks that the stream exists.
func NewNATS(ctx context.Context, cfg NATSConfig) (*NATS, error) {
	if cfg.URL == "" || cfg.Stream == "" {
		return nil, errors.New("dlq: NATS needs a URL and a stream")
	}
	if cfg.IDHeader == "" {
		cfg.IDHeader = idemnats.DefaultIDHeader
	}
	if cfg.TimeHeader == "" {
		cfg.TimeHeader = idemnats.DefaultTimeHeader
	}
	opts := append([]nats.Option{nats.Name("idem-dlq")}, cfg.Options...)
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS: %w", idembroker.RedactError(err, cfg.URL))
	}
	js, err := jetstream.New(nc)
	if err == nil {
		var s jetstream.Stream
		if s, err = js.Stream(ctx, cfg.Stream); err == nil {
			return &NATS{cfg: cfg, nc: nc, js: js, stream: s}, nil
		}
	}
	nc.Close()
	return nil, fmt.Errorf("dead-letter stream %s: %w", cfg.Stream, err)
}

// Name says which stream.
func (n *NATS) Name() string { return "nats stream " + n.cfg.Stream }

// Close closes the connection.
func (n *NATS) Close() error { n.nc.Close(); return nil }

// read returns the stream's messages now there (at most limit; 0: all),
// in sequence order, without consuming any.
func (n *NATS) read(ctx context.Context, limit int) ([]*jetstream.RawStreamMsg, error) {
	info, err := n.stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", n.cfg.Stream, err)
	}
	var out []*jetstream.RawStreamMsg
	last := info.State.LastSeq
	for seq := info.State.FirstSeq; seq <= last && seq > 0; {
		if limit > 0 && len(out) >= limit {
			break
		}
		// The next message at or after seq: deleted sequences are
		// skipped by the server.
		m, err := n.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading stream %s at %d: %w", n.cfg.Stream, seq, err)
		}
		if m.Sequence > last {
			break
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
	return out, nil
}

// letter turns a stream message into a letter.
func (n *NATS) letter(m *jetstream.RawStreamMsg) Letter {
	h := make(map[string]string, len(m.Header))
	for k, v := range m.Header {
		if len(v) > 0 {
			h[k] = v[0]
		}
	}
	e := idembroker.ReadEnvelope(h)
	id := h[n.cfg.IDHeader]
	if n.cfg.IDHeader == jetstream.MsgIDHeader && id != "" && id == e.Origin {
		// The dedupe key of a letter without an ID, not an ID.
		id = ""
	}
	var header time.Time
	if v := h[n.cfg.TimeHeader]; v != "" {
		if t, err := idembroker.ParseEventTime(v); err == nil {
			header = t
		}
	}
	t, src := idem.EventTime(id, header, m.Time)
	l := Letter{
		ID: id, DLQ: n.cfg.Stream, Position: "#" + strconv.FormatUint(m.Sequence, 10),
		Reason: e.Reason, Outcome: e.Outcome, Consumer: e.Consumer, Attempts: e.Attempts,
		Origin: e.Origin, Redriven: e.Redriven, Time: t, TimeSource: src, TimeFrom: src.String(),
		Key: h[idemnats.HeaderSubject], Headers: h, Body: m.Data,
	}
	if l.Reason == "" {
		l.Reason = "unknown"
	}
	l.Target = l.Key
	if l.Target == "" {
		l.Target = n.cfg.Target
	}
	return l
}

// Peek reads the letters (at most limit; 0: all) and leaves them there.
func (n *NATS) Peek(ctx context.Context, limit int) ([]Letter, error) {
	ms, err := n.read(ctx, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Letter, 0, len(ms))
	for _, m := range ms {
		out = append(out, n.letter(m))
	}
	return out, nil
}

// Walk hands the letters to decide. A Send is published to its subject
// and, once its PubAck came back (and was not a duplicate, see [NATS]),
// deleted from the dead-letter stream; a Drop is deleted.
func (n *NATS) Walk(ctx context.Context, limit int, decide func(*Letter) (Action, error), done func(*Letter, Action, bool)) error {
	ms, err := n.read(ctx, limit)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := ctx.Err(); err != nil {
			return err
		}
		l := n.letter(m)
		act, err := decide(&l)
		if err != nil {
			return err
		}
		switch act {
		case Keep:
			continue
		case Send:
			if err := n.republish(ctx, m, &l); err != nil {
				return err
			}
		}
		// Deleting runs to its end once the republish is confirmed: an
		// interruption here would leave a second copy.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
		err = n.stream.DeleteMsg(dctx, m.Sequence)
		cancel()
		report(done, &l, act, err == nil)
		if err != nil {
			return fmt.Errorf("deleting letter %q (#%d) from %s (it stays; a redrive sent again is absorbed by the inbox): %w", l.ID, m.Sequence, n.cfg.Stream, err)
		}
	}
	return nil
}

// republish publishes the redrive of m to the letter's target and waits
// for the PubAck.
func (n *NATS) republish(ctx context.Context, m *jetstream.RawStreamMsg, l *Letter) error {
	if l.Target == "" {
		return fmt.Errorf("letter %q names no subject to redrive to", l.ID)
	}
	h := nats.Header{}
	for k, v := range m.Header {
		// JetStream's publish expectations (Nats-Expected-Stream, set by
		// the dead letter's publish) were meant for an earlier publish.
		if !deadLetterHeader(k) && k != idemnats.HeaderSubject && !strings.HasPrefix(k, "Nats-Expected-") {
			h[k] = v
		}
	}
	if l.Origin != "" && h.Get(jetstream.MsgIDHeader) == l.Origin {
		// The dead-letter stream's dedupe key, which idemnats gives a
		// message without a Nats-Msg-Id: not the producer's.
		h.Del(jetstream.MsgIDHeader)
	}
	h.Set(idembroker.HeaderRedriven, strconv.Itoa(l.Redriven+1))
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ack, err := n.js.PublishMsg(pctx, &nats.Msg{Subject: l.Target, Header: h, Data: m.Data})
	if err != nil {
		return fmt.Errorf("republishing %q to %s: %w; it stays in the DLQ", l.ID, l.Target, err)
	}
	if ack.Duplicate {
		window := "its duplicate window"
		if s, err := n.js.Stream(pctx, ack.Stream); err == nil {
			window = fmt.Sprintf("its duplicate window (%v)", s.CachedInfo().Config.Duplicates)
		}
		return fmt.Errorf("republishing %q to %s: stream %s dropped it as a duplicate of the original, whose Nats-Msg-Id is still within %s; it stays in the DLQ: redrive it once the window has passed", l.ID, l.Target, ack.Stream, window)
	}
	return nil
}
