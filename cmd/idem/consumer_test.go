package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemrabbitmq"
	"github.com/idemkit/idem/pgxinbox"
)

// The fleet child's environment: the database, the queue and its DLQ.
const (
	fleetChildEnv = "IDEM_PAUSE_FLEET_CHILD"
	fleetDBEnv    = "IDEM_PAUSE_FLEET_DB"
	fleetQueueEnv = "IDEM_PAUSE_FLEET_QUEUE"
	fleetDLQEnv   = "IDEM_PAUSE_FLEET_DLQ"
)

// fleetChild is one process of the fleet: a RabbitMQ consumer "billing"
// over the inbox, whose handler records each message it applies with its
// delivery attempt and the process's number. It prints its health as one
// JSON line every 100ms and stops on SIGTERM.
func fleetChild(t *testing.T) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(fleetDBEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	child := os.Getenv(fleetChildEnv)
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "billing", Key: idem.ByMessageID, Logger: logger,
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO pause_effects (id, attempt, redelivered, child) VALUES ($1, $2, $3, $4)`,
				m.ID, m.Attempt, m.Redelivered, child)
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemrabbitmq.NewConsumer(proc, &idemrabbitmq.Config{
		URL: testAMQPURL(), Queue: os.Getenv(fleetQueueEnv), DeadLetterQueue: os.Getenv(fleetDLQEnv),
		Prefetch: 20, BatchSize: 10, Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		enc := json.NewEncoder(os.Stdout)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
				_ = enc.Encode(c.Health())
			}
		}
	}()
	if err := c.Run(ctx); err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
}

// fleetProc is a running child and the last health it printed.
type fleetProc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	health idembroker.Health
	done   chan struct{}
}

func (p *fleetProc) last() idembroker.Health {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.health
}

// A fleet of two consumer processes takes a stream of messages. Paused with
// `idem consumer pause`, both stop claiming within seconds and report the
// pause (who, since, why) in their health, while messages keep arriving:
// nothing is dead-lettered and no delivery is given back to the broker.
// Resumed with `idem consumer resume`, they apply every message exactly
// once.
func TestConsumerPauseResumeFleet(t *testing.T) {
	if os.Getenv(fleetChildEnv) != "" {
		fleetChild(t)
		return
	}
	if testing.Short() {
		t.Skip("runs two consumer processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newDLQEnv(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE pause_effects (id text NOT NULL, attempt int NOT NULL, redelivered bool NOT NULL, child text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	effects := func() (rows, distinct int) {
		t.Helper()
		if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM pause_effects`).Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		return rows, distinct
	}
	waitFor := func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("waited %v for %s", limit, what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// The fleet.
	procs := make([]*fleetProc, 2)
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestConsumerPauseResumeFleet$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", fleetChildEnv, i+1), fleetDBEnv+"="+e.db,
			fleetQueueEnv+"="+e.topo.Queue, fleetDLQEnv+"="+e.topo.DeadLetterQueue)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &fleetProc{cmd: cmd, done: make(chan struct{})}
		procs[i] = p
		go func() {
			defer close(p.done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var h idembroker.Health
				if json.Unmarshal(sc.Bytes(), &h) == nil && h.Consumer != "" {
					p.mu.Lock()
					p.health = h
					p.mu.Unlock()
				}
			}
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
			}
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("child %d stderr:\n%s", i+1, stderr.String())
			}
		})
	}

	// The stream: a message every 5ms, confirmed, until stopped.
	var published atomic.Int64
	stopPublishing := make(chan struct{})
	publisherDone := make(chan error, 1)
	go func() {
		publisherDone <- func() error {
			ch, err := e.conn.Channel()
			if err != nil {
				return err
			}
			defer ch.Close()
			if err := ch.Confirm(false); err != nil {
				return err
			}
			for i := 1; ; i++ {
				select {
				case <-stopPublishing:
					return nil
				case <-time.After(5 * time.Millisecond):
				}
				c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", e.topo.Queue, true, false, amqp.Publishing{
					MessageId: fmt.Sprintf("m-%06d", i), DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
				})
				if err != nil {
					return err
				}
				if ok, err := c.WaitContext(ctx); err != nil || !ok {
					return fmt.Errorf("message %d not confirmed: %v", i, err)
				}
				published.Add(1)
			}
		}()
	}()
	stopStream := func() {
		t.Helper()
		close(stopPublishing)
		if err := <-publisherDone; err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}

	// Both processes apply messages.
	waitFor("both processes to apply messages", 2*time.Minute, func() bool {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT child) FROM pause_effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 2
	})

	// Pause.
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"consumer", "pause", "--database", e.db, "--consumer", "billing", "--by", "alice", "--why", "incident 42"}, &out, &errb); code != 0 {
		t.Fatalf("idem consumer pause: exit %d\n%s%s", code, out.String(), errb.String())
	}
	pausedAt := time.Now()
	t.Logf("idem consumer pause: %s", strings.TrimSpace(out.String()))
	var since time.Time
	if err := e.pool.QueryRow(ctx, `SELECT paused_at FROM idem_consumer_pauses WHERE consumer = 'billing'`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	// Each process reports the pause once it holds a message: the stream
	// goes on, so each does.
	waitFor("both processes to report the pause in their health", 2*time.Minute, func() bool {
		for _, p := range procs {
			if h := p.last(); !h.Paused {
				return false
			}
		}
		return true
	})
	t.Logf("both processes report the pause %v after it", time.Since(pausedAt).Round(time.Millisecond))
	for i, p := range procs {
		h := p.last()
		if h.PausedBy != "alice" || h.PauseReason != "incident 42" || !h.PausedSince.Equal(since) {
			t.Errorf("child %d health: paused by %q since %v for %q; want alice, %v, incident 42", i+1, h.PausedBy, h.PausedSince, h.PauseReason, since)
		}
		if err := h.Ready(); err != nil {
			t.Errorf("child %d: a paused consumer is not ready: %v", i+1, err)
		}
	}
	// Nothing is claimed once the pause is read: the last claim began
	// within 5s of the pause (the database's clock on both sides), and
	// while at least 200 more messages arrive the effects stay as they are.
	var lastClaim time.Time
	if err := e.pool.QueryRow(ctx, `SELECT max(processed_at) FROM idem_inbox WHERE consumer = 'billing'`).Scan(&lastClaim); err != nil {
		t.Fatal(err)
	}
	if d := lastClaim.Sub(since); d > 5*time.Second {
		t.Errorf("a claim began %v after the pause", d)
	}
	t.Logf("last claim %v after the pause (negative: before)", lastClaim.Sub(since).Round(time.Millisecond))
	heldRows, _ := effects()
	mark := published.Load()
	waitFor("200 more messages to arrive while paused", 2*time.Minute, func() bool { return published.Load() >= mark+200 })
	if rows, _ := effects(); rows != heldRows {
		t.Fatalf("paused, the fleet applied %d more messages", rows-heldRows)
	}
	var claimsAfter int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM idem_inbox WHERE consumer = 'billing' AND processed_at > $1`, since.Add(5*time.Second)).Scan(&claimsAfter); err != nil {
		t.Fatal(err)
	}
	if claimsAfter != 0 {
		t.Fatalf("%d claims more than 5s after the pause", claimsAfter)
	}
	if n := e.depth(t, e.topo.DeadLetterQueue); n != 0 {
		t.Fatalf("%d messages dead-lettered during the pause", n)
	}
	var status bytes.Buffer
	if code := run(ctx, []string{"consumer", "status", "--database", e.db}, &status, io.Discard); code != 0 || !strings.Contains(status.String(), "billing  paused since") {
		t.Fatalf("idem consumer status: exit %d: %s", code, status.String())
	}

	// Resume, let the stream run a little more, stop it: every message
	// is applied once, on its first delivery.
	out.Reset()
	if code := run(ctx, []string{"consumer", "resume", "--database", e.db, "--consumer", "billing", "--by", "alice", "--why", "fixed"}, &out, &errb); code != 0 {
		t.Fatalf("idem consumer resume: exit %d\n%s%s", code, out.String(), errb.String())
	}
	t.Logf("idem consumer resume: %s", strings.TrimSpace(out.String()))
	mark = published.Load()
	waitFor("100 more messages after the resume", 2*time.Minute, func() bool { return published.Load() >= mark+100 })
	stopStream()
	n := int(published.Load())
	waitFor(fmt.Sprintf("all %d messages to be applied", n), 3*time.Minute, func() bool {
		rows, _ := effects()
		return rows >= n
	})
	waitFor("both processes to report the resume", 2*time.Minute, func() bool {
		for _, p := range procs {
			if p.last().Paused {
				return false
			}
		}
		return true
	})
	if rows, distinct := effects(); rows != n || distinct != n {
		t.Fatalf("effects: %d rows of %d messages for %d published; want each once", rows, distinct, n)
	}
	var spent int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pause_effects WHERE attempt <> 1 OR redelivered`).Scan(&spent); err != nil {
		t.Fatal(err)
	}
	if spent != 0 {
		t.Errorf("%d messages were given back to the broker (attempt above 1 or redelivered): a pause must hold, not spend", spent)
	}
	if d := e.depth(t, e.topo.DeadLetterQueue); d != 0 {
		t.Errorf("%d messages dead-lettered", d)
	}
	var audit []string
	rows, err := e.pool.Query(ctx, `SELECT action || ' ' || actor || ' ' || reason FROM idem_consumer_pause_log ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	if audit, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if strings.Join(audit, "; ") != "pause alice incident 42; resume alice fixed" {
		t.Errorf("audit rows = %q", audit)
	}
	t.Logf("%d messages, %d of them applied after the resume", n, n-heldRows)
}
