package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/mysqltest"
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
	for _, want := range []string{"(--seed 5)", "told in docs/design.md", "What varies between runs", "depends on timing",
		"What does not", "the idem side applies each event once"} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "(seed ") || strings.Contains(text, "seed's") {
		t.Errorf("report still says seed for the incident:\n%s", text)
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

// TestDemoCommandEventsOutOfRange: --events below the minimum, 0 included,
// is a usage error naming the flag; 0 is not read as the default.
func TestDemoCommandEventsOutOfRange(t *testing.T) {
	for _, n := range []string{"0", "-3", "9", "1000001"} {
		args := []string{"demo", "--events", n, "--quiet"}
		r := cli(t, args...)
		r.expect(t, 2, args)
		want := "idem demo: the number of renewals (--events) must be between 10 and 1,000,000, got " + n + "\n"
		if !strings.HasPrefix(r.stderr, want) || r.stdout != "" {
			t.Errorf("idem %s: stderr %q, stdout %q; want stderr starting %q and nothing on stdout", strings.Join(args, " "), r.stderr, r.stdout, want)
		}
	}
}

// TestDemoCommandSeedZero: 0 is a seed like the others, reported as given,
// and publishes other events than seed 1.
func TestDemoCommandSeedZero(t *testing.T) {
	type report struct {
		OK          bool  `json:"ok"`
		Seed        int64 `json:"seed"`
		Orders      int   `json:"orders"`
		OrderLines  int   `json:"order_lines"`
		Republished int   `json:"republished"`
	}
	runSeed := func(seed string) report {
		t.Helper()
		args := []string{"demo", "--events", "100", "--seed", seed, "--json", "--quiet"}
		r := cli(t, args...)
		r.expect(t, 0, args)
		var rep report
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatalf("idem %s: stdout is not JSON: %v\n%s", strings.Join(args, " "), err, r.stdout)
		}
		return rep
	}
	zero, one := runSeed("0"), runSeed("1")
	if zero.Seed != 0 || one.Seed != 1 || !zero.OK {
		t.Fatalf("--seed 0 reported seed %d (ok %v), --seed 1 reported seed %d; want each as given", zero.Seed, zero.OK, one.Seed)
	}
	if zero.OrderLines == one.OrderLines && zero.Republished == one.Republished && zero.Orders == one.Orders {
		t.Errorf("--seed 0 and --seed 1 generated the same events (%+v): 0 was read as 1", zero)
	}
	args := []string{"demo", "--events", "100", "--seed", "0", "--quiet"}
	if r := cli(t, args...); r.code != 0 || !strings.Contains(r.stdout, "(--seed 0)") {
		t.Errorf("idem %s: exit %d, report does not say --seed 0:\n%s", strings.Join(args, " "), r.code, r.stdout)
	}
}

// TestDemoCommandHelp: the demo's help is on stdout with exit 0, both ways.
func TestDemoCommandHelp(t *testing.T) {
	for _, args := range [][]string{{"demo", "-h"}, {"demo", "--help"}, {"help", "demo"}} {
		r := cli(t, args...)
		r.expect(t, 0, args)
		if !strings.HasPrefix(r.stdout, "usage: idem demo [flags]") || !strings.Contains(r.stdout, "  --events int") ||
			!strings.Contains(r.stdout, "  --seed int") || r.stderr != "" {
			t.Errorf("idem %s: stdout %q, stderr %q; want the demo's help on stdout only", strings.Join(args, " "), r.stdout, r.stderr)
		}
	}
}

// TestDemoCommandJSONErrors: with --json, a demo that cannot start or run
// prints its error as one JSON object on stdout.
func TestDemoCommandJSONErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		exit int
		want string
	}{
		{[]string{"demo", "--events", "0", "--json"}, 2, "--events"},
		{[]string{"demo", "--events", "50", "--json", "--quiet", "--postgres", "postgres://127.0.0.1:1/x"}, 3, "connection refused"},
	} {
		r := cli(t, tc.args...)
		r.expect(t, tc.exit, tc.args)
		je := parseJSONError(t, r, tc.args)
		if je.Exit != tc.exit || je.Command != "demo" || !strings.Contains(je.Error, tc.want) {
			t.Errorf("idem %s: JSON error %+v, want exit %d, command demo, an error naming %q", strings.Join(tc.args, " "), je, tc.exit, tc.want)
		}
	}
}

// TestDemoCommandUnknownHost: a PostgreSQL host that does not resolve
// fails in one line that says so once, its lines joined without ":;".
func TestDemoCommandUnknownHost(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"demo", "--events", "50", "--quiet", "--postgres", "postgres://postgres@nosuchhost.invalid/x"}, &out, &errb)
	msg := errb.String()
	if code != 3 || strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "idem demo: ") {
		t.Fatalf("exit %d, stderr %q; want exit 3 and one line", code, msg)
	}
	if strings.Contains(msg, ":;") || strings.Count(msg, "nosuchhost.invalid") > 2 || !strings.Contains(msg, "lookup nosuchhost.invalid") {
		t.Errorf("stderr %q: want the lookup's failure once, without \":;\"", msg)
	}
}

// TestOneLine: an error's lines become one, a line ending in a colon
// joined to its cause by a space.
func TestOneLine(t *testing.T) {
	for in, want := range map[string]string{
		"a: b":                        "a: b",
		"first\nsecond":               "first; second",
		"failed to connect:\n\tcause": "failed to connect: cause",
		"x:\n\n  y\nz\n":              "x: y; z",
	} {
		if got := oneLine(in); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDemoCommandMySQL runs the demo with --mysql on the test server
// (MariaDB here): the idem side ends with no duplicate effect and every
// event applied once, and the report says so; the naive side, on the same
// deliveries, shows the doubles.
func TestDemoCommandMySQL(t *testing.T) {
	dsn := mysqltest.ServerDSN(t)
	// A prefix of this process's own: another test binary running the
	// demo on the same server recreates the default databases.
	prefix := fmt.Sprintf("idem_demo_p%d", os.Getpid())
	t.Cleanup(func() {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return
		}
		defer db.Close()
		for _, name := range []string{prefix + "_naive", prefix + "_idem"} {
			_, _ = db.Exec("DROP DATABASE IF EXISTS " + name)
		}
	})
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"demo", "--events", "200", "--seed", "3", "--quiet", "--json", "--mysql", dsn, "--prefix", prefix}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s\nstdout:\n%s", code, errb.String(), out.String())
	}
	var rep struct {
		OK       bool   `json:"ok"`
		Database string `json:"database"`
		Naive    struct {
			DuplicateInvoices int `json:"duplicate_invoices"`
		} `json:"naive"`
		Idem struct {
			DuplicateInvoices int `json:"duplicate_invoices"`
			DuplicateRows     int `json:"duplicate_query_rows"`
			Invoices          int `json:"invoices"`
			Charges           int `json:"charges"`
			MerchantsOff      int `json:"merchants_off"`
			ProductsOff       int `json:"products_off"`
		} `json:"idem"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out.String())
	}
	if !rep.OK || rep.Idem.DuplicateInvoices != 0 || rep.Idem.DuplicateRows != 0 || rep.Idem.Invoices != 200 || rep.Idem.Charges != 200 ||
		rep.Idem.MerchantsOff != 0 || rep.Idem.ProductsOff != 0 {
		t.Errorf("idem side on MySQL: %+v (ok %v)", rep.Idem, rep.OK)
	}
	if rep.Database != "MariaDB" && rep.Database != "MySQL" {
		t.Errorf("database %q, want MariaDB or MySQL", rep.Database)
	}
	if rep.Naive.DuplicateInvoices == 0 {
		t.Errorf("the naive side shows no duplicate on MySQL: the run did not redeliver")
	}
	// The text report of the same databases says it in words.
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"demo", "--events", "200", "--seed", "3", "--quiet", "--mysql", dsn, "--prefix", prefix}, &out, &errb); code != 0 {
		t.Fatalf("text run: exit %d; stderr:\n%s", code, errb.String())
	}
	for _, want := range []string{"idem: 0 rows", "applied exactly once", "database " + prefix + "_idem"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDemoCommandMySQLSilent: a MySQL server that accepts the connection
// and never answers fails the demo within --connect-timeout, in one line.
func TestDemoCommandMySQLSilent(t *testing.T) {
	cfg := mysqltest.Database(t, "idem_demo_")
	p := netfault.New(t, cfg.Addr)
	p.Freeze()
	cfg.Addr = p.Addr()
	failsInOneLine(t, "did not answer within 1s", "--connect-timeout", "1s", "--mysql", cfg.FormatDSN())
	if p.Accepted() == 0 {
		t.Error("the demo never connected to the silent server")
	}
}

func TestDemoCommandBadMySQL(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--mysql", "mysql://root@127.0.0.1:3306/test"}, "not a URL"},
		{[]string{"--mysql", "root@tcp(127.0.0.1:3306)/test", "--postgres", "postgres://127.0.0.1/x"}, "choose PostgreSQL or MySQL"},
		{[]string{"--mysql", "root@tcp(127.0.0.1:3306)/test", "--sqlite-dir", t.TempDir()}, "choose MySQL or a SQLite directory"},
		{[]string{"--mysql", "root@tcp(127.0.0.1:3306"}, "user:password@tcp(host:3306)/database"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"demo", "--quiet"}, c.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, want 2 naming %q; stderr:\n%s", c.args, code, c.want, errb.String())
		}
	}
}
