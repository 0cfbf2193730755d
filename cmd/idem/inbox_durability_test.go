package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
)

// idem inbox check prints the durability warnings a consumer would log
// at start, keeps its exit status (the consumer still starts), and gives
// the settings read in --json.
func TestInboxCheckWarnsOfLosableCommits(t *testing.T) {
	url := pgtest.Schema(t)
	inboxRun(t, 0, "migrate", "--database", url)
	if out := inboxRun(t, 0, "check", "--database", url); out != "idem_inbox: OK\n" {
		t.Fatalf("check on a server that keeps its commits: %q", out)
	}
	var doc struct {
		Durability struct {
			Settings map[string]string   `json:"settings"`
			Risks    []map[string]string `json:"risks"`
		} `json:"durability"`
	}
	if err := json.Unmarshal([]byte(inboxRun(t, 0, "check", "--database", url, "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Durability.Settings["synchronous_commit"] == "" || len(doc.Durability.Risks) != 0 {
		t.Fatalf("--json durability = %+v, want the settings read and no risk", doc.Durability)
	}

	off := url + "&options=-c%20synchronous_commit%3Doff"
	out := inboxRun(t, 0, "check", "--database", off)
	if !strings.HasPrefix(out, "idem_inbox: OK\n") || !strings.Contains(out, "warning: acknowledged effects could be lost: synchronous_commit is off") ||
		!strings.Contains(out, "fix: ALTER ROLE") || !strings.Contains(out, "synchronous_commit=off") {
		t.Fatalf("check with synchronous_commit off:\n%s", out)
	}
	if err := json.Unmarshal([]byte(inboxRun(t, 0, "check", "--database", off, "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Durability.Risks) != 1 || !strings.Contains(doc.Durability.Risks[0]["what"], "synchronous_commit is off") {
		t.Fatalf("--json durability with synchronous_commit off = %+v", doc.Durability)
	}
}
