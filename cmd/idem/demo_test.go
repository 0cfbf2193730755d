package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/sqliteinbox"
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

// failsInOneLine runs the demo with args and checks that it failed with
// exit 3 and one line on stderr naming want, without a panic.
func failsInOneLine(t *testing.T, want string, args ...string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"demo", "--events", "50", "--quiet"}, args...), &out, &errb)
	msg := strings.TrimSuffix(errb.String(), "\n")
	if code != 3 {
		t.Errorf("%v: exit %d, want 3; stderr:\n%s", args, code, errb.String())
	}
	if strings.Count(errb.String(), "\n") != 1 || strings.Contains(msg, "goroutine") || strings.Contains(msg, "panic") {
		t.Errorf("%v: stderr is not one line:\n%s", args, errb.String())
	}
	if !strings.HasPrefix(msg, "idem demo: ") || !strings.Contains(msg, want) {
		t.Errorf("%v: stderr %q, want a line naming %q", args, msg, want)
	}
	if out.Len() != 0 {
		t.Errorf("%v: a failed demo printed a report:\n%s", args, out.String())
	}
}

func TestDemoCommandPostgresRefused(t *testing.T) {
	// Nothing listens on port 1: the connection is refused.
	failsInOneLine(t, "connection refused", "--postgres", "postgres://127.0.0.1:1/x")
}

func TestDemoCommandPostgresSilent(t *testing.T) {
	// A server that accepts the connection and never answers.
	p := netfault.New(t, "127.0.0.1:5432")
	p.Freeze()
	failsInOneLine(t, "did not answer within 1s", "--connect-timeout", "1s",
		"--postgres", p.URL(t, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
	if p.Accepted() == 0 {
		t.Error("the demo never connected to the silent server")
	}
}

func TestDemoCommandRabbitMQSilent(t *testing.T) {
	p := netfault.New(t, "127.0.0.1:5672")
	p.Freeze()
	failsInOneLine(t, "RabbitMQ", "--connect-timeout", "1s", "--rabbitmq", p.URL(t, "amqp://guest:guest@127.0.0.1:5672/"))
	if p.Accepted() == 0 {
		t.Error("the demo never connected to the silent server")
	}
}

func TestDemoCommandBadURLs(t *testing.T) {
	for _, args := range [][]string{
		{"--postgres", "mysql://127.0.0.1/x"},
		{"--rabbitmq", "http://127.0.0.1:5672/"},
		{"--postgres", "postgres://127.0.0.1/x", "--sqlite-dir", t.TempDir()},
		{"--connect-timeout", "-1s"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"demo", "--quiet"}, args...), &out, &errb)
		if code != 2 || !strings.HasPrefix(errb.String(), "idem demo: ") {
			t.Errorf("%v: exit %d, want 2; stderr:\n%s", args, code, errb.String())
		}
	}
}

// TestDemoCommandWording checks that the report says which counts vary
// between runs and which do not, and that --seed is the random seed.
func TestDemoCommandWording(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"demo", "--events", "100", "--seed", "5", "--quiet"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	text := out.String()
	for _, want := range []string{"(--seed 5)", "source documents", "What varies between runs", "depends on timing",
		"What does not", "the idem side applies each event once"} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "(seed ") || strings.Contains(text, "seed's") {
		t.Errorf("report still says seed for the source documents:\n%s", text)
	}
	if strings.Contains(text, "kept for inspection") {
		t.Errorf("report points at SQLite files removed at exit:\n%s", text)
	}
}

// TestDemoCommandJSONPaths checks that the JSON names no file removed at
// exit, and names the kept files with --sqlite-dir.
func TestDemoCommandJSONPaths(t *testing.T) {
	type side struct {
		Where *string `json:"where"`
	}
	var rep struct {
		OK    bool `json:"ok"`
		Naive side `json:"naive"`
		Idem  side `json:"idem"`
	}
	demoJSON := func(args ...string) {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"demo", "--events", "100", "--json", "--quiet"}, args...), &out, &errb); code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
		}
		rep.Naive, rep.Idem = side{}, side{}
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("stdout is not JSON: %v\n%s", err, out.String())
		}
		if strings.Contains(out.String(), os.TempDir()+string(os.PathSeparator)+"idem-demo-") {
			t.Errorf("JSON names a temporary directory removed at exit:\n%s", out.String())
		}
	}
	demoJSON()
	if rep.Naive.Where != nil || rep.Idem.Where != nil {
		t.Errorf("without --sqlite-dir, where: %v / %v, want none", rep.Naive.Where, rep.Idem.Where)
	}
	dir := t.TempDir()
	demoJSON("--sqlite-dir", dir)
	for name, s := range map[string]side{"naive": rep.Naive, "idem": rep.Idem} {
		if s.Where == nil || *s.Where != filepath.Join(dir, name+".db") {
			t.Errorf("%s where %v, want %s", name, s.Where, filepath.Join(dir, name+".db"))
			continue
		}
		// The file is there after the run, and holds the side's invoices.
		db, err := sqliteinbox.Open(*s.Where)
		if err != nil {
			t.Fatalf("opening %s: %v", *s.Where, err)
		}
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM invoices`).Scan(&n); err != nil || n < 100 {
			t.Errorf("%s: %d invoices (%v), want at least 100", *s.Where, n, err)
		}
		db.Close()
	}
}
