package redistest

import (
	"context"
	"testing"
)

// A server of the test's own keeps, across a SIGKILL and a restart, what
// it answered (appendfsync always), and a prefix's keys are gone after its
// test.
func TestServerSurvivesKill(t *testing.T) {
	s := Start(t)
	rdb := s.Client(nil)
	ctx := context.Background()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a killed server")
	}
	s.Restart()
	if v, err := rdb.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("after restart k = %q, %v; want v", v, err)
	}
}

func TestPrefixCleansUp(t *testing.T) {
	rdb := Client(t)
	var p string
	t.Run("inner", func(t *testing.T) {
		p = Prefix(t, rdb)
		if err := rdb.Set(context.Background(), p+"x", "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
	})
	if n, err := rdb.Exists(context.Background(), p+"x").Result(); err != nil || n != 0 {
		t.Fatalf("key under %s exists after its test: %d, %v", p, n, err)
	}
}
