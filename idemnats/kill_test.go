package idemnats_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/natstest"
)

// killEnv carries the child's database URL, server URL and stream.
const killEnv = "IDEM_NATS_KILL_CHILD"

// afterKillCode is the exit code the child must not reach: it is killed
// first.
const afterKillCode = 43

// A consumer process SIGKILLed after its batch committed and before any
// ack reached the server (the incident in docs/design.md) loses nothing
// and doubles nothing: after AckWait the server redelivers the batch to
// a new consumer, the inbox finds the markers, and every message has
// exactly one effect, the killed batch's met again as Duplicates.
func TestKillBetweenCommitAndAck(t *testing.T) {
	if env := os.Getenv(killEnv); env != "" {
		killChild(t, env)
		return
	}
	srv := natstest.Start(t)
	_, js := connect(t, srv.URL())
	stream := uniqueName(t)
	createStreams(t, js, stream)
	d := newDB(t)
	ids := publish(t, js, stream, "inv", 20)

	// A child that never reaches the fault point is killed after two
	// minutes, and the test fails.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestKillBetweenCommitAndAck$", "-test.count=1")
	cmd.Env = append(os.Environ(), killEnv+"="+strings.Join([]string{d.url, srv.URL(), stream}, "|"))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if ctx.Err() != nil || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed between commit and ack: %v\n%s", err, out)
	}
	rows, distinct := d.effects(t)
	if rows == 0 || rows != distinct {
		t.Fatalf("after the kill: %d effects of %d messages; want the killed batch's, once each", rows, distinct)
	}
	t.Logf("the killed consumer committed %d messages and acked none", rows)

	var s settles
	c, err := idemnats.NewConsumer(d.processor(t, &s), &idemnats.Config{URL: srv.URL(), Stream: stream, Logger: quiet, FetchWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	// The killed batch comes back once its AckWait (4s) ran out.
	waitFor(t, 60*time.Second, "every message applied and the killed batch met again", func() bool {
		_, n := d.effects(t)
		return n == len(ids) && s.count(idem.Duplicate) >= rows
	})
	if err := stop(); err != nil {
		t.Fatalf("Run = %v; want nil after a shutdown", err)
	}
	if r, n := d.effects(t); r != len(ids) || n != len(ids) {
		t.Errorf("%d effects of %d messages; want %d, one each", r, n, len(ids))
	}
	if got := s.count(idem.Duplicate); got != rows {
		t.Errorf("%d Duplicates; want %d, the killed batch's", got, rows)
	}
	if st := c.Stats(); st.DeadLettered != 0 || st.Redelivered < uint64(rows) {
		t.Errorf("stats %+v; want no dead letter and at least %d redelivered", st, rows)
	}
}

// killChild consumes with batches of 5 and kills its own process at the
// first BeforeSettle: the batch committed, nothing acked.
func killChild(t *testing.T, env string) {
	parts := strings.Split(env, "|")
	d := openDB(t, parts[0])
	c, err := idemnats.NewConsumer(d.processor(t), &idemnats.Config{
		URL: parts[1], Stream: parts[2], BatchSize: 5, AckWait: 4 * time.Second, Logger: quiet,
		Faults: func(_ context.Context, point idem.FaultPoint, _ []idem.Message) error {
			if point == idemnats.BeforeSettle {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Minute)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background())
	os.Exit(afterKillCode)
}
