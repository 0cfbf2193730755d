package idemkafka_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/idemkit/idem/pgxinbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgProxy stands between pgx and PostgreSQL, to make outages the real way:
// once stopped, it answers no new connection (the client's connect_timeout
// runs out) and cuts the open ones, as a database host that went away does;
// once frozen, the open connections go silent too, without being cut.
type pgProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	up     chan struct{} // closed while the proxy answers
	conns  map[net.Conn]struct{}
}

func newPGProxy(t testing.TB, target string) *pgProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: target, up: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.up)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.start()
		p.mu.Lock()
		defer p.mu.Unlock()
		for c := range p.conns {
			_ = c.Close()
		}
	})
	return p
}

func (p *pgProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

// serve forwards c once the proxy answers; a connection that arrives while
// it is stopped waits, unanswered, for the client to give up.
func (p *pgProxy) serve(c net.Conn) {
	p.mu.Lock()
	up := p.up
	p.mu.Unlock()
	<-up
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { p.pipe(u, c); _ = u.Close() }()
	p.pipe(c, u)
	_ = c.Close()
}

// pipe copies from src to dst; while the proxy is frozen or stopped, what
// it read waits.
func (p *pgProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			up := p.up
			p.mu.Unlock()
			<-up
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// freeze makes the proxy stop answering without cutting anything: the open
// connections go silent (half-open, as behind a dead switch) and new ones
// are left unanswered.
func (p *pgProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
		p.up = make(chan struct{})
	default:
	}
}

// stop makes the proxy stop answering: open connections are cut, new ones
// are left unanswered.
func (p *pgProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
		p.up = make(chan struct{})
	default:
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// start makes the proxy answer again, the waiting connections included.
func (p *pgProxy) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
	default:
		close(p.up)
	}
}

// throughProxy returns a store over d's schema whose connections go through
// a proxy, with a connect timeout of one second.
func (d *db) throughProxy(t testing.TB) (*pgxinbox.Store, *pgProxy) {
	t.Helper()
	u, err := url.Parse(d.url)
	if err != nil {
		t.Fatal(err)
	}
	p := newPGProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The database answers again before the pool closes, so that closing
	// does not wait for connections the proxy left unanswered.
	t.Cleanup(p.start)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return store, p
}
