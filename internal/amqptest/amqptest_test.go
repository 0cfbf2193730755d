package amqptest

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestQueueIsTheTestsOwn pins that a test's queue carries a message to it
// and is gone once the test ended.
func TestQueueIsTheTestsOwn(t *testing.T) {
	var name string
	t.Run("uses", func(t *testing.T) {
		conn := Dial(t)
		name = Queue(t, conn, nil)
		if !strings.HasPrefix(name, "idem-test-") || name == Queue(t, conn, nil) {
			t.Fatalf("queue names: %q", name)
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Publish("", name, true, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			d, ok, err := ch.Get(name, true)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				if string(d.Body) != "x" {
					t.Fatalf("body %q", d.Body)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the message never reached the queue")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	conn := Dial(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclarePassive(name, true, false, false, false, nil); err == nil {
		t.Fatalf("queue %s outlived its test", name)
	}
}
