package reconcile

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
)

// SentRows is what [Outbox] reads: *outbox.Outbox over any database it
// supports (PostgreSQL with pgx or database/sql, SQLite) has it.
type SentRows interface {
	Table() string
	SentRows(ctx context.Context, f outbox.SentFilter) ([]outbox.Record, error)
}

// Outbox is the producer's outbox as a source: the rows the broker
// confirmed, by event time, each with the payload the relay published.
type Outbox struct {
	// Rows is the producer's outbox. Required.
	Rows SentRows
	// Destination keeps the rows of the topic or exchange the consumer
	// reads; empty: every row.
	Destination string
	// RoutingKey keeps the rows with this RabbitMQ routing key; empty: any.
	RoutingKey string
}

// Name implements [Source].
func (o *Outbox) Name() string {
	n := "outbox " + o.Rows.Table()
	if o.Destination != "" {
		n += " destination " + o.Destination
	}
	if o.RoutingKey != "" {
		n += " routing key " + o.RoutingKey
	}
	return n
}

// Payloads implements [Source]: outbox rows carry theirs.
func (o *Outbox) Payloads() bool { return true }

// Read implements [Source]: the sent rows in r, by sequence. The message
// is the one the outbox's publishers send: the row's ID as the message ID,
// its event time (the time inside the ID), its headers and body.
func (o *Outbox) Read(ctx context.Context, r Range, page func([]Candidate) error) error {
	if o.Rows == nil {
		return errors.New("reconcile: Outbox.Rows is nil")
	}
	var after int64
	for {
		rows, err := o.Rows.SentRows(ctx, outbox.SentFilter{From: r.From, To: r.To, Destination: o.Destination, AfterSeq: after, Limit: batchSize})
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		after = rows[len(rows)-1].Seq
		cs := make([]Candidate, 0, len(rows))
		for i := range rows {
			rec := &rows[i]
			if o.RoutingKey != "" && rec.RoutingKey != o.RoutingKey {
				continue
			}
			t, src := idem.EventTime(rec.ID, rec.EventTime, time.Time{})
			cs = append(cs, Candidate{
				Message:  idem.Message{ID: rec.ID, Source: rec.Destination, Key: rec.Key, Headers: rec.Headers, Body: rec.Body, Time: t, TimeSource: src},
				Position: "seq " + strconv.FormatInt(rec.Seq, 10),
				Record:   rec,
			})
		}
		if len(cs) > 0 {
			if err := page(cs); err != nil {
				return err
			}
		}
	}
}

// IDFile is a list of message IDs as a source, for a producer without an
// outbox: one ID a line, optionally followed by its event time in RFC 3339
// (separated by a space, a tab or a comma). Blank lines and lines starting
// with # are skipped. Without a time, an ID that is a UUIDv7 gives its
// own. It carries no payload: [Repair] refuses it.
type IDFile struct {
	// Path names the file in reports.
	Path string
	// R is the file's content.
	R io.Reader
}

// Name implements [Source].
func (f *IDFile) Name() string { return "id file " + f.Path }

// Payloads implements [Source]: an ID file has none.
func (f *IDFile) Payloads() bool { return false }

// Read implements [Source].
func (f *IDFile) Read(ctx context.Context, r Range, page func([]Candidate) error) error {
	sc := bufio.NewScanner(f.R)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var cs []Candidate
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.FieldsFunc(text, func(r rune) bool { return r == ' ' || r == '\t' || r == ',' })
		if len(fields) > 2 {
			return fmt.Errorf("reconcile: %s line %d: want an ID and optionally an RFC 3339 time, got %q", f.Path, line, text)
		}
		var header time.Time
		if len(fields) == 2 {
			t, err := time.Parse(time.RFC3339Nano, fields[1])
			if err != nil {
				return fmt.Errorf("reconcile: %s line %d: time %q is not RFC 3339 (2026-01-02T15:04:05Z)", f.Path, line, fields[1])
			}
			header = t
		}
		id := fields[0]
		t, src := idem.EventTime(id, header, time.Time{})
		if !r.Contains(t) {
			continue
		}
		cs = append(cs, Candidate{Message: idem.Message{ID: id, Time: t, TimeSource: src}, Position: "line " + strconv.Itoa(line)})
		if len(cs) == batchSize {
			if err := page(cs); err != nil {
				return err
			}
			cs = nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reconcile: reading %s: %w", f.Path, err)
	}
	if len(cs) > 0 {
		return page(cs)
	}
	return nil
}
