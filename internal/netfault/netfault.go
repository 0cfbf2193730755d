// Package netfault makes network failures the way production has them, for
// tests: a TCP proxy between a client and a real server (PostgreSQL,
// RabbitMQ) that can go silent, cut its connections, or come back. Tests
// that use it meet the errors a real outage gives — a connect timeout, a
// read that never returns, a reset — instead of an injected error whose
// class someone chose.
package netfault

import (
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections to a target. It starts forwarding.
type Proxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int64
	refused  atomic.Int64

	mu       sync.Mutex
	up       chan struct{} // closed while the proxy forwards
	refusing bool
	conns    map[net.Conn]struct{}
}

// New starts a proxy on 127.0.0.1 to target (host:port) and closes it when
// t ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("netfault: listening: %v", err)
	}
	p := &Proxy{ln: ln, target: target, up: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.up)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns rawURL (postgres://…, amqp://…) with its host and port
// replaced by the proxy's.
func (p *Proxy) URL(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("netfault: parsing %q: %v", rawURL, err)
	}
	u.Host = p.Addr()
	return u.String()
}

// Accepted counts the connections the proxy accepted, answered or not.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Freeze makes the proxy go silent without cutting anything, as a server
// behind a dead switch: open connections stay open and carry nothing
// (reads never return), and new connections are accepted and never
// answered (a client's connect timeout runs out).
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
		p.up = make(chan struct{})
	default:
	}
}

// Stop is Freeze, and cuts the open connections too, as a host that went
// away: clients see their connections reset and their reconnects hang.
func (p *Proxy) Stop() {
	p.Freeze()
	p.Cut()
}

// Refuse cuts the open connections and turns new ones away at once (they
// are closed as soon as accepted), as a server that is down but whose host
// answers: clients fail fast instead of waiting for a timeout. Refused
// counts them.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	p.refusing = true
	p.mu.Unlock()
	p.Cut()
}

// Refused counts the connections turned away while refusing.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// Cut closes every open connection once; new ones go through as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Restore makes the proxy forward again; the connections that waited go
// through.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = false
	select {
	case <-p.up:
	default:
		close(p.up)
	}
}

func (p *Proxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		go p.serve(c)
	}
}

// serve forwards c once the proxy forwards; a connection that arrives
// while it is silent waits, unanswered.
func (p *Proxy) serve(c net.Conn) {
	p.mu.Lock()
	refusing := p.refusing
	p.mu.Unlock()
	if refusing {
		p.refused.Add(1)
		_ = c.Close()
		return
	}
	p.track(c)
	<-p.gate()
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		p.untrack(c)
		_ = c.Close()
		return
	}
	p.track(u)
	go func() {
		p.pipe(u, c)
		p.untrack(u)
		_ = u.Close()
	}()
	p.pipe(c, u)
	p.untrack(c)
	_ = c.Close()
}

func (p *Proxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pipe copies src to dst; while the proxy is silent, what it read waits.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.Restore()
	p.Cut()
}
