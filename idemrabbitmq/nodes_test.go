package idemrabbitmq

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A cluster's list: the consuming and the dead-letter connection get the
// URLs (or the dead-letter ones), each its own copy and turn.
func TestURLsDefaultForBothConnections(t *testing.T) {
	t.Parallel()
	urls := []string{"amqp://guest:guest@127.0.0.1:5701/", "amqp://guest:guest@127.0.0.1:5702/"}
	c := newTestConsumer(t, &Config{URLs: urls})
	if !slices.Equal(c.brokers.urls, urls) || !slices.Equal(c.dlBrokers.urls, urls) {
		t.Fatalf("nodes = %v and %v, want %v for both", c.brokers.urls, c.dlBrokers.urls, urls)
	}
	urls[0] = "amqp://changed" // the caller's slice is not the consumer's
	if c.brokers.urls[0] == urls[0] {
		t.Error("the consumer shares the caller's URLs slice")
	}
	if c.brokers == c.dlBrokers {
		t.Error("the two connections share one turn")
	}
	one := newTestConsumer(t, &Config{URL: "amqp://guest:guest@127.0.0.1:5672/", DeadLetterURLs: []string{"amqp://10.0.0.1:5672/", "amqp://10.0.0.2:5672/"}})
	if len(one.brokers.urls) != 1 || len(one.dlBrokers.urls) != 2 {
		t.Errorf("nodes = %v and %v, want the URL and the two dead-letter URLs", one.brokers.urls, one.dlBrokers.urls)
	}
}

// The node choice: a dial goes once round the list from the node whose
// turn it is, skipping the nodes that refuse; a session that ended passes
// the turn to the next node.
func TestNodesRoundRobin(t *testing.T) {
	t.Parallel()
	n := newNodes([]string{"amqp://a:1/", "amqp://b:2/", "amqp://c:3/"})
	down := map[string]bool{}
	var tried []string
	try := func(url string) (*amqp.Connection, net.Conn, error) {
		tried = append(tried, url)
		if down[url] {
			return nil, nil, errors.New("connection refused")
		}
		return nil, nil, nil
	}
	dial := func() int {
		t.Helper()
		tried = nil
		_, _, i, err := n.dial(try)
		if err != nil {
			t.Fatalf("dial: %v (tried %v)", err, tried)
		}
		return i
	}
	if i := dial(); i != 0 {
		t.Fatalf("first dial went to node %d, want 0", i)
	}
	if i := dial(); i != 0 {
		t.Errorf("a dial without a session ending moved to node %d", i)
	}
	n.ended(0) // node a died under the session
	down["amqp://a:1/"] = true
	if i := dial(); i != 1 || len(tried) != 1 {
		t.Errorf("after node 0 ended: node %d, tried %v; want node 1 at once", i, tried)
	}
	n.ended(1)
	down["amqp://c:3/"] = true
	if i := dial(); i != 1 || !slices.Equal(tried, []string{"amqp://c:3/", "amqp://a:1/", "amqp://b:2/"}) {
		t.Errorf("node %d after trying %v; want c and a skipped, then b", i, tried)
	}
	n.ended(1)
	down["amqp://b:2/"] = true
	tried = nil
	_, _, i, err := n.dial(try)
	if err == nil || i != -1 || len(tried) != 3 {
		t.Fatalf("every node down: node %d, err %v, tried %v", i, err, tried)
	}
	if !strings.Contains(err.Error(), "node a:1") || !strings.Contains(err.Error(), "node c:3") {
		t.Errorf("the error does not name each node: %v", err)
	}
	n.ended(-1) // a session that never connected moves nothing
	down["amqp://a:1/"] = false
	if i := dial(); i != 0 {
		t.Errorf("node %d, want a, back in its turn", i)
	}
}

// A URI's password never shows in an address.
func TestNodeAddrHidesCredentials(t *testing.T) {
	t.Parallel()
	n := newNodes([]string{"amqp://user:secret@broker-1:5701/vhost"})
	if got := n.addr(0); got != "broker-1:5701" {
		t.Errorf("addr = %q, want broker-1:5701", got)
	}
}
