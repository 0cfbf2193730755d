package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func TestDemoCommandText(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"demo", "--events", "200", "--seed", "3"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s\nstdout:\n%s", code, errb.String(), out.String())
	}
	for _, want := range []string{"duplicate invoices", "customers double-billed", "charges made / expected", "200 / 200",
		"merchant balances off", "stock off", "duplicates skipped", "HAVING COUNT(*) > 1", "idem: 0 rows", "applied exactly once"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// Not a terminal: the progress goes to stderr as one line per phase.
	if !strings.Contains(errb.String(), "demo: publishing") || !strings.Contains(errb.String(), "demo: redelivering") {
		t.Errorf("stderr lacks the progress phases:\n%s", errb.String())
	}
}

func TestDemoCommandJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"demo", "--events", "200", "--json", "--quiet"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	if errb.Len() != 0 {
		t.Errorf("--quiet wrote to stderr:\n%s", errb.String())
	}
	var rep struct {
		OK       bool `json:"ok"`
		Renewals int  `json:"renewals"`
		Naive    struct {
			DuplicateInvoices int `json:"duplicate_invoices"`
			DuplicateRows     int `json:"duplicate_query_rows"`
		} `json:"naive"`
		Idem struct {
			DuplicateInvoices int `json:"duplicate_invoices"`
			Invoices          int `json:"invoices"`
			Charges           int `json:"charges"`
		} `json:"idem"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out.String())
	}
	if !rep.OK || rep.Renewals != 200 || rep.Idem.DuplicateInvoices != 0 || rep.Idem.Invoices != 200 || rep.Idem.Charges != 200 {
		t.Errorf("idem side in JSON: %+v", rep)
	}
	if rep.Naive.DuplicateInvoices == 0 || rep.Naive.DuplicateRows == 0 {
		t.Errorf("naive side shows no duplicates in JSON: %+v", rep.Naive)
	}
}

func TestDemoCommandBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--events", "3"},
		{"demo", "--rabbitmq", "amqp://x/", "--kafka", "k:9092"},
		{"demo", "stray"},
		{"demo", "--no-such-flag"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code == 0 {
			t.Errorf("%v: exit 0, want failure", args)
		}
	}
}
