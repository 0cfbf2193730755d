package idemrabbitmq

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// nodes is the one place that chooses which broker node a connection goes
// to. The consuming connection and the dead-letter connection each have
// their own.
//
// A dial tries the nodes once round the list, starting with the node
// whose turn it is, and keeps the first that connects; a node that
// refuses (or does not answer within the dial timeout) passes the turn to
// the next at once. When a session on a node ends, the turn passes to the
// node after it (round-robin): the reconnect after a node died goes to a
// survivor without first waiting on the dead one, and a node that came
// back is reached again in its turn. Only a dial that failed on every node
// leaves the caller to its reconnect backoff.
type nodes struct {
	urls []string

	mu   sync.Mutex
	turn int // index of the node tried first
}

func newNodes(urls []string) *nodes { return &nodes{urls: urls} }

// dial connects through try to the first node that takes the connection,
// and returns the connection, its socket and the node's index. When every
// node failed, the error joins each node's, by address.
func (n *nodes) dial(try func(url string) (*amqp.Connection, net.Conn, error)) (*amqp.Connection, net.Conn, int, error) {
	n.mu.Lock()
	first := n.turn
	n.mu.Unlock()
	var errs []error
	for k := range n.urls {
		i := (first + k) % len(n.urls)
		conn, sock, err := try(n.urls[i])
		if err == nil {
			n.mu.Lock()
			n.turn = i
			n.mu.Unlock()
			return conn, sock, i, nil
		}
		if len(n.urls) == 1 {
			return nil, nil, i, err
		}
		errs = append(errs, fmt.Errorf("node %s: %w", n.addr(i), err))
	}
	return nil, nil, -1, errors.Join(errs...)
}

// ended passes the turn to the node after node i, whose session ended.
func (n *nodes) ended(i int) {
	if i < 0 {
		return
	}
	n.mu.Lock()
	if n.turn == i {
		n.turn = (i + 1) % len(n.urls)
	}
	n.mu.Unlock()
}

// addr is node i's host:port, for logs and errors: never the URI, which
// may hold a password.
func (n *nodes) addr(i int) string {
	if i < 0 || i >= len(n.urls) {
		return ""
	}
	u, err := amqp.ParseURI(n.urls[i])
	if err != nil {
		return "node " + strconv.Itoa(i+1)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}
