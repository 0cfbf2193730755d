package console

import (
	"github.com/idemkit/idem/idembroker"

	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/dlq"
)

// counted finds a delivery count above zero on a letter's page.
var counted = regexp.MustCompile(`x-delivery-count</code></th><td><code>[1-9]`)

// Viewing the console spends no delivery of a dead letter: on a quorum
// queue that drops a letter given back more than three times, forty
// page loads that each read the queue again (the overview, a letter's
// page, a redrive's dry run) leave every letter there.
func TestPageViewsAreFree(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q := uniqueName(t)
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-delivery-limit": int64(3)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := e.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ids := []string{"inv-a", "inv-b", "inv-c", ""}
	for _, id := range ids {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Timestamp: time.Now(),
			Body: []byte(`{"invoice":"` + id + `"}`), Headers: amqp.Table{idembroker.HeaderReason: "boom", idembroker.HeaderConsumer: consumer, idembroker.HeaderOrigin: e.topo.Queue, idembroker.HeaderAttempts: int64(5)}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publishing %s: %v %v", id, ok, err)
		}
	}
	src, err := dlq.NewRabbitMQ(dlq.RabbitMQConfig{URL: amqpURL(), Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	// Every page reads the queue again.
	s, err := New(Config{Inbox: e.inbox, DB: e.pool, Sources: []dlq.Source{src}, CacheFor: time.Nanosecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		_ = s.Close()
	})
	for i := range 40 {
		var path string
		switch i % 3 {
		case 0:
			path = "/?reread=1"
		case 1:
			path = "/dlq/0/show?id=" + ids[i%3]
		case 2:
			path = "/dlq/0/redrive?" + url.Values{"consumer": {consumer}, "reason": {"boom"}}.Encode()
		}
		code, page := get(t, ts, path)
		if code != http.StatusOK {
			t.Fatalf("load %d, GET %s: %d\n%s", i, path, code, page)
		}
		if i%3 == 0 && !strings.Contains(page, `<td class="n count">4</td>`) {
			t.Fatalf("load %d: the overview does not show the four letters:\n%s", i, page)
		}
		if i%3 == 2 && !strings.Contains(page, fmt.Sprintf("%d letters match", len(ids))) && !strings.Contains(page, "inv-c") {
			t.Fatalf("load %d: the dry run does not show the letters:\n%s", i, page)
		}
	}
	if n := e.depth(q); n != len(ids) {
		t.Fatalf("the DLQ holds %d letters after the page loads, want %d", n, len(ids))
	}
	for _, id := range ids[:3] {
		if code, page := get(t, ts, "/dlq/0/show?id="+id); code != http.StatusOK || counted.MatchString(page) {
			t.Fatalf("letter %s after the page loads: %d (counted as delivered?)\n%s", id, code, page)
		}
	}
	// The letter without a message ID is shown by its position, which
	// stays what it was through all the reads.
	if code, page := get(t, ts, "/dlq/0/show?at=%234"); code != http.StatusOK || !strings.Contains(page, "{&#34;invoice&#34;:&#34;&#34;}") {
		t.Fatalf("the letter without an ID at #4: %d\n%s", code, page)
	}
}
