package console

import (
	"context"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/dlq"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"

	"github.com/idemkit/idem/internal/kafkatest"
)

// A Kafka dead-letter topic in the console: its letters are listed and
// grouped, and a redrive through the page produces them to their origin
// topic and settles them.
func TestKafkaTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := kafkatest.NewCluster(t)
	brokers := c.ListenAddrs()
	topic := "orders-" + strings.TrimPrefix(uniqueName(t), "console-test-")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tn := range []string{topic, topic + ".dlq"} {
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, tn); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range []string{"ord-1", "ord-2"} {
		r := idemkafka.NewRecord(topic+".dlq", id, []byte(id), []byte(`{"order":"`+id+`"}`))
		r.Timestamp = time.Now().Add(-time.Hour)
		r.Headers = append(r.Headers,
			kgo.RecordHeader{Key: idembroker.HeaderReason, Value: []byte("handling message " + id + ": carrier unknown")},
			kgo.RecordHeader{Key: idembroker.HeaderOutcome, Value: []byte("dead_lettered")},
			kgo.RecordHeader{Key: idembroker.HeaderConsumer, Value: []byte("orders-ship")},
			kgo.RecordHeader{Key: idembroker.HeaderAttempts, Value: []byte("1")},
			kgo.RecordHeader{Key: idembroker.HeaderOrigin, Value: []byte(topic + "/0/" + strconv.Itoa(i))})
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	in, err := dlq.NewInbox(pool, &dlq.InboxConfig{Key: idem.ByMessageID})
	if err != nil {
		t.Fatal(err)
	}
	src, err := dlq.NewKafka(ctx, dlq.KafkaConfig{Brokers: brokers, Topic: topic + ".dlq"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Inbox: in, DB: pool, Sources: []dlq.Source{src}, Token: "tok", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s)
	defer ts.Close()

	code, page := get(t, ts, "/")
	if code != http.StatusOK || !strings.Contains(page, `<span class="total">2</span> letters`) ||
		!regexp.MustCompile(`<td class="n count">2</td>\s*<td>orders-ship</td>`).MatchString(page) {
		t.Fatalf("overview: %d, want the topic's 2 letters in one group\n%s", code, page)
	}
	link := regexp.MustCompile(`href="(/dlq/0/redrive\?[^"]*carrier[^"]*)"`).FindStringSubmatch(page)
	if link == nil {
		t.Fatalf("no redrive link\n%s", page)
	}
	_, page = get(t, ts, html.UnescapeString(link[1]))
	if !strings.Contains(page, "Dry run: <strong>2</strong> letters match") {
		t.Fatalf("preview\n%s", page)
	}
	form := formOf(t, page)
	form.Set("token", "tok")
	form.Set("by", "ops")
	code, page = post(t, ts, "/dlq/0/redrive", form, nil)
	if code != http.StatusOK || !strings.Contains(page, "redriven 2 of 2") {
		t.Fatalf("redrive: %d\n%s", code, page)
	}
	// The origin topic has the two, with their message IDs.
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	got := map[string]int{}
	for len(got) < 2 && ctx.Err() == nil {
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == idemkafka.DefaultIDHeader {
					got[string(h.Value)]++
				}
			}
		})
	}
	if got["ord-1"] != 1 || got["ord-2"] != 1 {
		t.Errorf("origin topic holds %v, want ord-1 and ord-2 once each", got)
	}
	_, page = get(t, ts, "/?reread=1")
	if !strings.Contains(page, `<span class="total">0</span> letters`) {
		t.Errorf("the redriven letters are still listed\n%s", page)
	}
}
