// Package redistest gives tests Redis: a client of the shared server
// (IDEM_REDIS_ADDR, or 127.0.0.1:6379) with a key prefix of the test's own,
// whose keys are deleted when the test ends; and, for tests that kill and
// restart Redis, a redis-server process of the test's own on a free port,
// with its data in a temporary directory. No test kills the shared server.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultAddr is used when IDEM_REDIS_ADDR is unset.
const DefaultAddr = "127.0.0.1:6379"

// FixHint is the command that brings the shared server up.
const FixHint = "start it with: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 (or run make test), or set IDEM_REDIS_ADDR"

// Addr returns IDEM_REDIS_ADDR or DefaultAddr.
func Addr() string {
	if a := os.Getenv("IDEM_REDIS_ADDR"); a != "" {
		return a
	}
	return DefaultAddr
}

// Client returns a client of the shared server, closed when t ends; the
// test fails with the command that fixes a missing server.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s: %v (%s)", Addr(), err, FixHint)
	}
	return rdb
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// Prefix returns a key prefix no other test uses ("idemtest:<name>:<random>:")
// and deletes every key under it from rdb when t ends.
func Prefix(t testing.TB, rdb redis.UniversalClient) string {
	t.Helper()
	n := strings.Trim(unsafeChars.ReplaceAllString(t.Name(), "-"), "-")
	if len(n) > 60 {
		n = n[len(n)-60:]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	p := "idemtest:" + n + ":" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, p+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				t.Logf("deleting the keys under %s: %v", p, err)
			}
		}
	})
	return p
}

// Server is a redis-server process of one test, on a port of its own,
// with its data (an append-only file with appendfsync always: every write
// it answered is on disk) in a directory of its own.
type Server struct {
	t    testing.TB
	Addr string
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
	exit chan error
}

// Start starts a redis-server of t's own, stopped when t ends; extra are
// more settings ("--appendfsync", "everysec"). The test is skipped when
// redis-server is not installed.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skipf("redis-server not installed: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &Server{t: t, dir: t.TempDir(), port: port, Addr: "127.0.0.1:" + strconv.Itoa(port)}
	s.args = append([]string{bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
	}, extra...)
	s.start()
	t.Cleanup(func() {
		if s.cmd != nil {
			s.Kill()
		}
	})
	return s
}

func (s *Server) start() {
	s.t.Helper()
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting redis-server: %v", err)
	}
	s.cmd, s.exit = cmd, make(chan error, 1)
	go func() { s.exit <- cmd.Wait() }()
	if err := s.waitReady(30 * time.Second); err != nil {
		s.Kill()
		s.t.Fatalf("redis-server on %s: %v", s.Addr, err)
	}
}

// waitReady waits until the server answers PING with PONG (not LOADING).
func (s *Server) waitReady(within time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		select {
		case e := <-s.exit:
			s.exit <- e
			return fmt.Errorf("exited: %v", e)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.Join(errors.New("did not answer PING"), err)
}

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client(opts *redis.Options) *redis.Client {
	var o redis.Options
	if opts != nil {
		o = *opts
	}
	o.Addr = s.Addr
	rdb := redis.NewClient(&o)
	s.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Kill kills the server with SIGKILL, as a crash of its host does, and
// waits until it is gone. What it answered is in its append-only file.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exit
	s.cmd = nil
}

// Restart starts the server again on its port and directory, after Kill,
// and waits until it loaded its data and answers.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("redistest: Restart of a server that runs")
	}
	s.start()
}
