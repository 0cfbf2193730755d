package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSmoke runs every consumer on every broker with a small workload and
// its redeliveries: each guarded consumer must apply every message exactly
// once (run fails otherwise), and the unguarded one must show the double
// effects the redeliveries cause, which proves the check can fail. No rate
// is asserted.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and RabbitMQ")
	}
	out := filepath.Join(t.TempDir(), "peers.json")
	db := strings.Replace(env("IDEM_PEERS_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idem_peers?sslmode=disable"), "/idem_peers?", "/idem_peers_smoke?", 1)
	var stdout bytes.Buffer
	err := run([]string{"-messages", "2000", "-dups", "40", "-database", db, "-out", out}, &stdout)
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
		if r.Messages != 2040 {
			t.Errorf("%s/%s: %d deliveries, want 2040", r.Broker, r.Key, r.Messages)
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
	for name, mk := range brokers {
		for _, c := range mk().Consumers {
			if !seen[name+"/"+c.Key] {
				t.Errorf("%s/%s did not run", name, c.Key)
			}
		}
	}
	if !strings.Contains(stdout.String(), "| rabbitmq | idem batched (HandleBatch) |") {
		t.Errorf("the table lacks idem's row:\n%s", stdout.String())
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
