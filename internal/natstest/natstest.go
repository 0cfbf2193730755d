// Package natstest runs real NATS JetStream servers in-process for tests:
// the nats-server module, embedded, on a random local port with a store
// directory of the test's own. A server can be stopped and started again
// on the same port and store, as a restart in production does, and three
// can form a JetStream cluster.
package natstest

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyWithin bounds how long a started server may take to accept
// connections; generous, for a loaded machine.
const readyWithin = 30 * time.Second

// Server is one embedded JetStream server. Its port and store survive
// [Server.Stop] and [Server.Start], so clients reconnect to the same
// address and find the streams and consumers they left.
type Server struct {
	t    testing.TB
	mu   sync.Mutex
	opts server.Options
	srv  *server.Server
}

// Start starts a JetStream server on a random port of 127.0.0.1 with a
// temporary store, and shuts it down when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, opts: baseOptions(t, "n1")}
	s.opts.Port = freePort(t)
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

func baseOptions(t testing.TB, name string) server.Options {
	return server.Options{
		ServerName: name,
		Host:       "127.0.0.1",
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoLog:      true,
		NoSigs:     true,
		// Acknowledged writes are on disk when the PubAck leaves: the
		// tests stop servers and count what survived.
		SyncAlways: true,
	}
}

// URL is the server's client URL, nats://127.0.0.1:<port>.
func (s *Server) URL() string {
	return "nats://127.0.0.1:" + strconv.Itoa(s.opts.Port)
}

// Name is the server's name: n1 for a lone server, n1 to n3 in a
// cluster, as JetStream names stream and consumer leaders.
func (s *Server) Name() string { return s.opts.ServerName }

// Running reports whether the server runs.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv != nil
}

// Start starts the server again (on the same port and store) after
// [Server.Stop]; it does nothing when the server runs. It fails the test
// when the server does not accept connections within 30s.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return
	}
	opts := s.opts // NewServer keeps and changes what it is given
	srv, err := server.NewServer(&opts)
	if err != nil {
		s.t.Fatalf("natstest: creating server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyWithin) {
		srv.Shutdown()
		s.t.Fatalf("natstest: server %s not ready within %v", s.opts.ServerName, readyWithin)
	}
	s.srv = srv
}

// Stop shuts the server down, as a node stopped by its operator, and
// waits until it has: clients lose their connections and try to
// reconnect.
func (s *Server) Stop() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Embedded returns the running server, or nil.
func (s *Server) Embedded() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Cluster is three JetStream servers routed to each other, named n1, n2,
// n3, in one cluster; streams of 3 replicas span all of them.
type Cluster struct {
	Servers []*Server
}

// StartCluster starts a three-node JetStream cluster on random ports and
// shuts it down when t ends. It waits until the cluster has a meta
// leader.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	const n = 3
	clientPorts, routePorts := make([]int, n), make([]int, n)
	for i := range n {
		clientPorts[i], routePorts[i] = freePort(t), freePort(t)
	}
	var routes []*url.URL
	for _, p := range routePorts {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(p)})
	}
	c := &Cluster{}
	for i := range n {
		s := &Server{t: t, opts: baseOptions(t, fmt.Sprintf("n%d", i+1))}
		s.opts.Port = clientPorts[i]
		s.opts.Cluster = server.ClusterOpts{Name: "idem", Host: "127.0.0.1", Port: routePorts[i]}
		s.opts.Routes = routes
		c.Servers = append(c.Servers, s)
	}
	// The servers start together: each waits for the others' routes
	// before JetStream elects a meta leader.
	var wg sync.WaitGroup
	for _, s := range c.Servers {
		wg.Go(func() { s.startAsync() })
	}
	wg.Wait()
	for _, s := range c.Servers {
		t.Cleanup(s.Stop)
	}
	deadline := time.Now().Add(readyWithin)
	for !c.hasLeader() {
		if time.Now().After(deadline) {
			t.Fatalf("natstest: the cluster elected no JetStream meta leader within %v", readyWithin)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c
}

// startAsync is Start for a cluster node, which is ready only once its
// peers are: it reports failures with Errorf, not Fatalf, being called
// off the test's goroutine.
func (s *Server) startAsync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	opts := s.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		s.t.Errorf("natstest: creating server %s: %v", s.opts.ServerName, err)
		return
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyWithin) {
		srv.Shutdown()
		s.t.Errorf("natstest: server %s not ready within %v", s.opts.ServerName, readyWithin)
		return
	}
	s.srv = srv
}

func (c *Cluster) hasLeader() bool {
	for _, s := range c.Servers {
		if srv := s.Embedded(); srv != nil && srv.JetStreamIsLeader() {
			return true
		}
	}
	return false
}

// Server returns the node named name (n1, n2, n3), or nil.
func (c *Cluster) Server(name string) *Server {
	for _, s := range c.Servers {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

// URLs are the client URLs of every node, comma-separated, as nats.Connect
// takes them.
func (c *Cluster) URLs() string {
	out := ""
	for i, s := range c.Servers {
		if i > 0 {
			out += ","
		}
		out += s.URL()
	}
	return out
}

// freePort returns a local TCP port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
