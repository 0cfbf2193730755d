package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSmoke runs every consumer on RabbitMQ and Kafka with a small
// workload and its redeliveries: each guarded consumer must apply every
// message exactly once (run fails otherwise), and the unguarded one must
// show the double effects the redeliveries cause, which proves the check
// can fail. No rate is asserted.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and RabbitMQ")
	}
	smoke(t, []string{"rabbitmq", "kafka"}, 2000, 40)
}

// TestSmokeStreams is TestSmoke on NATS JetStream (an embedded server)
// and Redis Streams, with fewer messages: their per-message consumers
// commit one transaction each.
func TestSmokeStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and Redis")
	}
	smoke(t, []string{"nats", "redis"}, 200, 10, "-settle", "100ms")
}

// smoke runs every consumer of names with n messages and dups
// redeliveries and checks what each left.
func smoke(t *testing.T, names []string, n, dups int, args ...string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "peers.json")
	db := strings.Replace(env("IDEM_PEERS_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idem_peers?sslmode=disable"), "/idem_peers?", "/idem_peers_smoke?", 1)
	var stdout bytes.Buffer
	args = append([]string{"-only", strings.Join(names, ","), "-messages", fmt.Sprint(n), "-dups", fmt.Sprint(dups), "-database", db, "-out", out}, args...)
	err := run(args, &stdout)
	t.Log(stdout.String())
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rep.Results {
		seen[r.Broker+"/"+r.Key] = true
		if r.Messages != n+dups {
			t.Errorf("%s/%s: %d deliveries, want %d", r.Broker, r.Key, r.Messages, n+dups)
		}
		switch {
		case r.Guarded && !r.OK:
			t.Errorf("%s/%s: not exactly once: %+v", r.Broker, r.Key, r.Check)
		case !r.Guarded && (r.OK || r.Check.Doubled == 0 || r.Check.Missing != 0):
			t.Errorf("%s/%s: the unguarded consumer should double the redelivered messages and miss none: %+v", r.Broker, r.Key, r.Check)
		}
		if r.Rate <= 0 || r.Ratio <= 0 {
			t.Errorf("%s/%s: rate %v, ratio %v", r.Broker, r.Key, r.Rate, r.Ratio)
		}
	}
	for _, name := range names {
		for _, c := range brokers[name]().Consumers {
			if !seen[name+"/"+c.Key] {
				t.Errorf("%s/%s did not run", name, c.Key)
			}
		}
		if row := "| " + name + " | idem batched (HandleBatch) |"; !strings.Contains(stdout.String(), row) {
			t.Errorf("the table lacks %q:\n%s", row, stdout.String())
		}
	}
}

// TestWorkload pins the workload's shape: the redeliveries are copies of
// earlier messages placed after them, and the total is the distinct
// credits'.
func TestWorkload(t *testing.T) {
	w := NewWorkload(500, 50)
	if len(w.Msgs) != 550 {
		t.Fatalf("%d deliveries, want 550", len(w.Msgs))
	}
	first := map[string]int{}
	var total int64
	for i, m := range w.Msgs {
		if _, ok := first[m.ID]; ok {
			continue
		}
		first[m.ID] = i
		e, err := Decode(m.ID, m.Body)
		if err != nil {
			t.Fatal(err)
		}
		total += e.Amount
	}
	if len(first) != 500 || total != w.Total {
		t.Fatalf("%d distinct messages totalling %d, want 500 totalling %d", len(first), total, w.Total)
	}
}
