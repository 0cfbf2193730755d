package idemredis_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// The environment of the child process of TestKilledBetweenCommitAndAck.
const (
	childStream = "IDEM_REDIS_CHILD_STREAM"
	childDB     = "IDEM_REDIS_CHILD_DB"
)

// A consumer process SIGKILLed after its database commit and before its
// XACK (a child process of the test, killed by itself at the fault point)
// leaves its entries pending under its name; a new consumer takes them
// over with XAUTOCLAIM once they are idle, finds their markers, and acks
// them: every entry applied exactly once, nothing left pending
// (docs/design.md 4; the incident in docs/design.md).
func TestKilledBetweenCommitAndAck(t *testing.T) {
	if os.Getenv(childStream) != "" {
		killedChild(t)
		return
	}
	rdb := redistest.Client(t)
	stream := redistest.Prefix(t, rdb) + "orders"
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, rdb, stream+".dlq"); err != nil {
		t.Fatal(err)
	}
	url := pgtest.Schema(t)
	pool, store := inbox(t, url)
	ids := publish(t, rdb, stream, "order", 20)

	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledBetweenCommitAndAck$", "-test.count=1")
	cmd.Env = append(os.Environ(), childStream+"="+stream, childDB+"="+url)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child ended with %v; want it killed by SIGKILL at the fault point\n%s", err, out)
	}
	committed := effects(t, pool)
	left := pending(t, rdb, stream, "g")
	if len(committed) == 0 || left == 0 {
		t.Fatalf("after the kill: %d messages committed, %d entries pending; want some of each", len(committed), left)
	}
	t.Logf("the child was killed after committing %d messages; %d entries pending under its name", len(committed), left)

	c, err := idemredis.New(rdb, processor(t, store), &idemredis.Config{
		Stream: stream, Group: "g", ClaimIdle: 300 * time.Millisecond, Block: 200 * time.Millisecond, Logger: quiet(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, 60*time.Second, "every entry acked", func() bool {
		return pending(t, rdb, stream, "g") == 0 && len(effects(t, pool)) == len(ids)
	})
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	got := effects(t, pool)
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("%s applied %d times; want once", id, got[id])
		}
	}
	s := c.Stats()
	if s.Claimed == 0 || s.Duplicates == 0 {
		t.Errorf("stats %+v: want entries taken over (Claimed) and found in the inbox (Duplicates)", s)
	}
	if n, _ := rdb.XLen(ctx, stream+".dlq").Result(); n != 0 {
		t.Errorf("%d dead letters; want none", n)
	}
}

// killedChild consumes the parent's stream and kills its own process with
// SIGKILL at the first fault point after a commit.
func killedChild(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	_, store := inbox(t, os.Getenv(childDB))
	c, err := idemredis.New(rdb, processor(t, store), &idemredis.Config{
		Stream: os.Getenv(childStream), Group: "g", BatchSize: 5, Logger: quiet(t),
		Faults: func(context.Context, idem.FaultPoint, string, []string) error {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(context.Background())
	t.Fatalf("Run returned %v; want the process killed", err)
}
