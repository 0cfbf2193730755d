package idemrabbitmq

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

func TestMessageFromDelivery(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 9, 1, 2, 14, 11, 0, time.UTC)
	d := &amqp.Delivery{
		MessageId:   "inv-1",
		RoutingKey:  "billing.renewed",
		Body:        []byte(`{"customer":"cus-8421"}`),
		Timestamp:   ts,
		Redelivered: true,
		DeliveryTag: 42,
		Headers: amqp.Table{
			"x-delivery-count": int64(2),
			"tenant":           "acme",
			"n":                int32(7),
			"raw":              []byte("b"),
			"x-retry-count":    int64(99), // a publisher's counter: ignored
		},
	}
	m := Message(d, "invoices", "")
	if m.ID != "inv-1" || m.Source != "invoices" || m.Key != "billing.renewed" || !m.Time.Equal(ts) || !m.Redelivered {
		t.Fatalf("got %+v", m)
	}
	if m.Attempt != 3 {
		t.Errorf("Attempt = %d, want x-delivery-count+1 = 3", m.Attempt)
	}
	if m.Headers["tenant"] != "acme" || m.Headers["n"] != "7" || m.Headers["raw"] != "b" {
		t.Errorf("headers = %v", m.Headers)
	}
}

func TestMessageAttemptWithoutDeliveryCount(t *testing.T) {
	t.Parallel()
	if m := Message(&amqp.Delivery{MessageId: "a"}, "q", ""); m.Attempt != 1 {
		t.Errorf("first delivery: Attempt = %d, want 1", m.Attempt)
	}
	if m := Message(&amqp.Delivery{MessageId: "a", Redelivered: true}, "q", ""); m.Attempt != 0 {
		t.Errorf("redelivered, count unknown: Attempt = %d, want 0", m.Attempt)
	}
}

func TestMessageIDHeader(t *testing.T) {
	t.Parallel()
	d := &amqp.Delivery{MessageId: "property", Headers: amqp.Table{"event-id": int64(123)}}
	if m := Message(d, "q", "event-id"); m.ID != "123" {
		t.Errorf("ID = %q, want the header's 123", m.ID)
	}
	// The header is configured but absent: no fallback to another identity.
	if m := Message(&amqp.Delivery{MessageId: "property"}, "q", "event-id"); m.ID != "" {
		t.Errorf("ID = %q, want empty (dead letter)", m.ID)
	}
}

func TestNewConsumerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	proc := mustProcessor(t)
	cases := map[string]Config{
		"no url":            {Queue: "q"},
		"no queue":          {URL: "amqp://127.0.0.1"},
		"prefetch < batch":  {URL: "amqp://127.0.0.1", Queue: "q", Prefetch: 10, BatchSize: 100},
		"negative workers":  {URL: "amqp://127.0.0.1", Queue: "q", Workers: -1},
		"library recovery":  {URL: "amqp://127.0.0.1", Queue: "q", AMQP: &amqp.Config{Recovery: &amqp.Recovery{}}},
		"bad backoff range": {URL: "amqp://127.0.0.1", Queue: "q", ReconnectBackoff: idem.Backoff{Initial: time.Minute, Max: time.Second}},
		"url and urls":      {URL: "amqp://127.0.0.1", URLs: []string{"amqp://127.0.0.2"}, Queue: "q"},
		"bad url in list":   {URLs: []string{"amqp://127.0.0.1", "http://127.0.0.2"}, Queue: "q"},
		"empty url in list": {URLs: []string{"amqp://127.0.0.1", ""}, Queue: "q"},
		"dead-letter both":  {URL: "amqp://127.0.0.1", Queue: "q", DeadLetterURL: "amqp://127.0.0.2", DeadLetterURLs: []string{"amqp://127.0.0.3"}},
		"bad dead-letter":   {URL: "amqp://127.0.0.1", Queue: "q", DeadLetterURLs: []string{"ftp://127.0.0.3"}},
	}
	for name, cfg := range cases {
		if _, err := NewConsumer(proc, &cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
	}
	c, err := NewConsumer(proc, &Config{URL: "amqp://127.0.0.1", Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Prefetch != 500 || c.cfg.BatchSize != 100 || c.cfg.BatchWait != 20*time.Millisecond || c.cfg.ConnectionName != "idem-unit" {
		t.Errorf("defaults not applied: %+v", c.cfg)
	}
}

// mustProcessor is a processor over a real store that these tests never
// reach: pgxpool connects lazily.
func mustProcessor(t *testing.T) *idem.Processor[pgx.Tx] {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.BaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "unit",
		Key:      idem.ByMessageID,
		Handler:  func(ctx context.Context, tx pgx.Tx, m idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// uuidV7 is a UUIDv7 whose time is at.
func uuidV7(at time.Time) string { return idem.NewUUIDv7(at) }

// The event time comes from the most stable source the message has: the
// UUIDv7 ID, then the x-event-time header (RFC 3339 or Unix ms), then the
// AMQP timestamp, which a republish refreshes.
func TestMessageEventTime(t *testing.T) {
	t.Parallel()
	idTime := time.Date(2026, 9, 1, 2, 14, 11, 0, time.UTC)
	header := time.Date(2026, 9, 2, 8, 0, 0, 500_000_000, time.UTC)
	broker := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
	v7 := uuidV7(idTime)
	for _, tc := range []struct {
		name   string
		d      amqp.Delivery
		want   time.Time
		source idem.TimeSource
	}{
		{"uuidv7 id", amqp.Delivery{MessageId: v7, Timestamp: broker, Headers: amqp.Table{idembroker.HeaderEventTime: header.Format(time.RFC3339Nano)}}, idTime, idem.TimeFromID},
		{"rfc 3339 header", amqp.Delivery{MessageId: "inv-1", Timestamp: broker, Headers: amqp.Table{idembroker.HeaderEventTime: header.Format(time.RFC3339Nano)}}, header, idem.TimeFromHeader},
		{"unix ms header", amqp.Delivery{MessageId: "inv-1", Timestamp: broker, Headers: amqp.Table{idembroker.HeaderEventTime: header.UnixMilli()}}, header, idem.TimeFromHeader},
		{"unix ms string header", amqp.Delivery{MessageId: "inv-1", Timestamp: broker, Headers: amqp.Table{idembroker.HeaderEventTime: strconv.FormatInt(header.UnixMilli(), 10)}}, header, idem.TimeFromHeader},
		{"timestamp header", amqp.Delivery{MessageId: "inv-1", Timestamp: broker, Headers: amqp.Table{idembroker.HeaderEventTime: header}}, header, idem.TimeFromHeader},
		{"unreadable header", amqp.Delivery{MessageId: "inv-1", Timestamp: broker, Headers: amqp.Table{idembroker.HeaderEventTime: "yesterday"}}, broker, idem.TimeFromBroker},
		{"broker timestamp", amqp.Delivery{MessageId: "inv-1", Timestamp: broker}, broker, idem.TimeFromBroker},
		{"nothing", amqp.Delivery{MessageId: "inv-1"}, time.Time{}, idem.TimeNone},
	} {
		m := Message(&tc.d, "q", "")
		if !m.Time.Equal(tc.want) || m.TimeSource != tc.source {
			t.Errorf("%s: time %v from %v, want %v from %v", tc.name, m.Time, m.TimeSource, tc.want, tc.source)
		}
		if bad := tc.name == "unreadable header"; (m.TimeErr != nil) != bad {
			t.Errorf("%s: TimeErr %v; want one only for the unreadable header", tc.name, m.TimeErr)
		}
	}
}
