package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pgtest"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// build compiles the service, with the race detector, once per test
// binary.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idem-service-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "service")
		out, err := exec.Command("go", "build", "-race", "-o", binary, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary != "" {
		_ = os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

// service is the service running as a subprocess.
type service struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string // of /metrics, /healthz, /readyz
	exit chan error
	seen chan struct{} // signalled on every log line
	mu   sync.Mutex
	all  []string         // every log line, for failure messages
	recs []map[string]any // every JSON log record
}

// start runs the service with args and waits until it serves.
func start(t *testing.T, args ...string) *service {
	t.Helper()
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, bin, append([]string{"--listen", "127.0.0.1:0", "--hold-after", "500ms"}, args...)...)
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &service{t: t, cmd: cmd, exit: make(chan error, 1), seen: make(chan struct{}, 1)}
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var rec map[string]any
			_ = json.Unmarshal(sc.Bytes(), &rec)
			s.mu.Lock()
			s.all = append(s.all, sc.Text())
			if rec != nil {
				s.recs = append(s.recs, rec)
			}
			s.mu.Unlock()
			select {
			case s.seen <- struct{}{}:
			default:
			}
		}
	}()
	go func() {
		<-lines // Wait only after the pipe is read to its end
		s.exit <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("service log:\n%s", s.log())
		}
	})
	s.addr = s.await("serving")["addr"].(string)
	return s
}

func (s *service) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.all, "\n")
}

// await returns the first log record with message msg.
func (s *service) await(msg string) map[string]any {
	s.t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		s.mu.Lock()
		for _, rec := range s.recs {
			if rec["msg"] == msg {
				s.mu.Unlock()
				return rec
			}
		}
		s.mu.Unlock()
		select {
		case <-s.seen:
		case err := <-s.exit:
			s.t.Fatalf("the service exited (%v) before logging %q", err, msg)
		case <-deadline:
			s.t.Fatalf("the service did not log %q", msg)
		}
	}
}

// get returns the status and body of path.
func (s *service) get(path string) (int, string) {
	s.t.Helper()
	resp, err := http.Get("http://" + s.addr + path)
	if err != nil {
		s.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// until polls path every 50ms until cond holds of its status and body.
func (s *service) until(path, what string, cond func(code int, body string) bool) {
	s.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, body := s.get(path)
		if cond(code, body) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s; last %s: %d %s", what, path, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// messages is idem_messages_total{consumer,outcome} as /metrics has it.
func (s *service) messages(consumer, outcome string) int {
	s.t.Helper()
	_, body := s.get("/metrics")
	prefix := fmt.Sprintf("idem_messages_total{consumer=%q,outcome=%q} ", consumer, outcome)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				s.t.Fatalf("metric line %q: %v", line, err)
			}
			return int(n)
		}
	}
	return 0
}

// stop sends SIGTERM and waits for the service to exit 0.
func (s *service) stop() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatal(err)
	}
	select {
	case err := <-s.exit:
		if err != nil {
			s.t.Fatalf("after SIGTERM the service exited with %v", err)
		}
	case <-time.After(time.Minute):
		s.t.Fatal("the service did not exit within a minute of SIGTERM")
	}
	if _, err := http.Get("http://" + s.addr + "/healthz"); err == nil {
		s.t.Fatal("the service still serves after it exited")
	}
}

// ledger is the service's database seen by the test, with a proxy in
// front of it for the service.
type ledger struct {
	pool  *pgxpool.Pool
	proxy *netfault.Proxy
	url   string // the service's URL, through the proxy
}

func newLedger(t *testing.T) *ledger {
	t.Helper()
	direct := pgtest.Schema(t)
	pool, err := pgxpool.New(context.Background(), direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p := netfault.New(t, u.Host)
	t.Cleanup(p.Restore)
	u.Host = p.Addr()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	return &ledger{pool: pool, proxy: p, url: u.String()}
}

// entries returns the ledger's rows, its distinct message IDs and the sum
// of the balances.
func (l *ledger) entries(t *testing.T) (rows, distinct int, balance int64) {
	t.Helper()
	ctx := context.Background()
	if err := l.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM ledger_entries`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := l.pool.QueryRow(ctx, `SELECT coalesce(sum(balance_cents), 0) FROM balances`).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	return rows, distinct, balance
}

func unique(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// ids returns n fresh message IDs.
func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = idem.NewUUIDv7(time.Now())
	}
	return out
}

// body is the credit message id carries: 1.00 to an account the ID
// picks, so that a redelivery carries the same body.
func body(id string) []byte {
	return fmt.Appendf(nil, `{"account":"acct-%c","amount_cents":100}`, id[len(id)-1])
}

// exercise is the test both brokers run: messages with a duplicate
// counted right, ready; the database stopped (a proxy that stops
// answering) while messages come, not ready and holding; the database
// back, ready and every held message applied once; SIGTERM, exit 0.
func exercise(t *testing.T, s *service, l *ledger, consumer string, publish func(ids []string)) {
	s.until("/readyz", "ready", func(code int, _ string) bool { return code == http.StatusOK })
	if code, _ := s.get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	first := ids(10)
	publish(append(first, first[3])) // one delivered twice
	s.until("/metrics", "10 applied, 1 duplicate", func(int, string) bool {
		return s.messages(consumer, "applied") == 10 && s.messages(consumer, "duplicate") == 1
	})
	if rows, distinct, balance := l.entries(t); rows != 10 || distinct != 10 || balance != 1000 {
		t.Fatalf("ledger: %d rows, %d distinct, balance %d; want 10, 10, 1000", rows, distinct, balance)
	}
	if _, metrics := s.get("/metrics"); !strings.Contains(metrics, `idem_inbox_stats_up{table="idem_inbox"} 1`) {
		t.Fatalf("/metrics does not read the inbox:\n%s", metrics)
	}

	l.proxy.Stop()
	publish(ids(5))
	var held string
	s.until("/readyz", "not ready, holding", func(code int, body string) bool {
		held = body
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"holding":true`)
	})
	if !strings.Contains(held, "holding messages") || !strings.Contains(held, idem.ErrUnavailable.Error()) {
		t.Fatalf("/readyz during the outage says: %s", held)
	}
	if code, body := s.get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz during the outage: %d %s, want alive", code, body)
	}

	l.proxy.Restore()
	s.until("/readyz", "ready after the outage", func(code int, _ string) bool { return code == http.StatusOK })
	s.until("/metrics", "15 applied", func(int, string) bool { return s.messages(consumer, "applied") == 15 })
	if rows, distinct, balance := l.entries(t); rows != 15 || distinct != 15 || balance != 1500 {
		t.Fatalf("ledger after the outage: %d rows, %d distinct, balance %d; want 15, 15, 1500", rows, distinct, balance)
	}
	if d := s.messages(consumer, "duplicate"); d != 1 {
		t.Fatalf("duplicates after the outage: %d, want 1", d)
	}
	s.stop()
}

func TestServiceRabbitMQ(t *testing.T) {
	t.Parallel()
	amqpURL := env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatalf("RabbitMQ at %s: %v; start it with: rabbitmq-server -detached", amqpURL, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	queue, consumer := unique("service-test"), unique("ledger")
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_, _ = ch.QueueDelete(queue+".dlq", false, false, false)
			_ = ch.Close()
		}
	})
	l := newLedger(t)
	s := start(t, "--broker", "rabbitmq", "--postgres", l.url, "--amqp", amqpURL, "--source", queue, "--consumer", consumer)
	pub, err := idemrabbitmq.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	exercise(t, s, l, consumer, func(ids []string) {
		msgs := make([]amqp.Publishing, len(ids))
		for i, id := range ids {
			msgs[i] = amqp.Publishing{MessageId: id, Body: body(id)}
		}
		if err := pub.Publish(context.Background(), "", queue, msgs...); err != nil {
			t.Fatal(err)
		}
	})
}

func TestServiceKafkaFake(t *testing.T) {
	t.Parallel()
	topic, consumer := unique("credits"), unique("ledger")
	l := newLedger(t)
	s := start(t, "--broker", "kafka", "--kafka-fake", "--postgres", l.url, "--source", topic, "--consumer", consumer)
	brokers, _ := s.await("in-process Kafka")["brokers"].(string)
	if brokers == "" {
		t.Fatal("the service did not say where its in-process Kafka listens")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	exercise(t, s, l, consumer, func(ids []string) {
		for _, id := range ids {
			if err := idemkafka.Publish(context.Background(), cl, topic, id, nil, body(id)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Without brokers, the Kafka service says what it needs.
func TestServiceKafkaNeedsBrokers(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	bin := build(t)
	cmd := exec.Command(bin, "--broker", "kafka", "--postgres", l.url, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "IDEM_KAFKA_BROKERS=")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "IDEM_KAFKA_BROKERS") || !strings.Contains(string(out), "-kafka-fake") {
		t.Fatalf("exit %v, output:\n%s", err, out)
	}
}

// A broker that refuses the connection: the service fails, and neither its
// log line nor the error it reports carries the password of the URL it was
// given.
func TestServiceConnectionErrorHidesThePassword(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now: the dial is refused
	const secret = "s3cret-broker-pw"
	for _, u := range []string{"amqp://guest:" + secret + "@" + addr + "/", "amqp://guest:" + secret + "@127.0.0.1:notaport/"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, build(t), "--listen", "127.0.0.1:0", "--broker", "rabbitmq", "--postgres", l.url, "--amqp", u, "--source", unique("service-test"), "--consumer", unique("ledger")).CombinedOutput()
		cancel()
		if err == nil {
			t.Fatalf("the service ran with a broker that refuses it:\n%s", out)
		}
		if !strings.Contains(string(out), "service failed") {
			t.Fatalf("no failure logged:\n%s", out)
		}
		if strings.Contains(string(out), secret) {
			t.Errorf("the password is in the log:\n%s", out)
		}
	}
}
