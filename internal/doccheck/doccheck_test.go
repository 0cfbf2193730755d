package doccheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// A ```go block in a document is one of three kinds:
//
//   - a complete file: its first line of code is a package clause. It is
//     built as a package of its own, as written.
//   - declarations: the line before the fence is <!-- snippet: decls -->.
//     The block is the body of a file in package snippet.
//   - statements (the default): the block is the body of a function
//     returning error, so it may `return err`.
//
// Declarations and statements may use the names in givens (ctx, pool, db,
// ch, …) as if the reader had them already, and the packages in
// imports by their usual names; the imports a block uses are added for it.
// Statements may leave a variable they declare at the top level unused
// (a snippet shows a value, the reader uses it). Every block is built with
// //line directives, so an error names the document and the line.

// imports maps a package name a snippet may use to its import path.
var imports = map[string]string{
	"bytes":        "bytes",
	"context":      "context",
	"errors":       "errors",
	"fmt":          "fmt",
	"http":         "net/http",
	"json":         "encoding/json",
	"log":          "log",
	"os":           "os",
	"slog":         "log/slog",
	"sql":          "database/sql",
	"testing":      "testing",
	"time":         "time",
	"pgx":          "github.com/jackc/pgx/v5",
	"pgxpool":      "github.com/jackc/pgx/v5/pgxpool",
	"amqp":         "github.com/rabbitmq/amqp091-go",
	"kgo":          "github.com/twmb/franz-go/pkg/kgo",
	"prometheus":   "github.com/prometheus/client_golang/prometheus",
	"idem":         "github.com/idemkit/idem",
	"audit":        "github.com/idemkit/idem/audit",
	"dlq":          "github.com/idemkit/idem/dlq",
	"idemkafka":    "github.com/idemkit/idem/idemkafka",
	"idemkey":      "github.com/idemkit/idem/idemkey",
	"idemnats":     "github.com/idemkit/idem/idemnats",
	"idemprom":     "github.com/idemkit/idem/idemprom",
	"idemrabbitmq": "github.com/idemkit/idem/idemrabbitmq",
	"idemtest":     "github.com/idemkit/idem/idemtest",
	"mysqlinbox":   "github.com/idemkit/idem/mysqlinbox",
	"outbox":       "github.com/idemkit/idem/outbox",
	"amqppub":      "github.com/idemkit/idem/outbox/amqppub",
	"kafkapub":     "github.com/idemkit/idem/outbox/kafkapub",
	"natspub":      "github.com/idemkit/idem/outbox/natspub",
	"jetstream":    "github.com/nats-io/nats.go/jetstream",
	"nats":         "github.com/nats-io/nats.go",
	"pgxinbox":     "github.com/idemkit/idem/pgxinbox",
	"reconcile":    "github.com/idemkit/idem/reconcile",
	"retention":    "github.com/idemkit/idem/retention",
	"sqlinbox":     "github.com/idemkit/idem/sqlinbox",
	"sqliteinbox":  "github.com/idemkit/idem/sqliteinbox",
	// idemotel is a module of its own: a block that uses it is built there.
	"idemotel": "github.com/idemkit/idem/idemotel",
	"trace":    "go.opentelemetry.io/otel/trace",
}

// givens are what a declarations or statements block may use without
// declaring it: what the surrounding program would have at hand. A block
// gets those it names.
var givens = []struct{ name, decl, comment string }{
	{"ctx", "= context.Background()", ""},
	{"pool", "*pgxpool.Pool", "the application's PostgreSQL pool"},
	{"db", "*sql.DB", "or its database/sql handle"},
	{"conn", "*amqp.Connection", "a RabbitMQ connection"},
	{"ch", "*amqp.Channel", "a channel on it"},
	{"brokers", "[]string", "Kafka seed brokers"},
	{"body", "[]byte", "a message body"},
	{"msg", "idem.Message", "a message"},
	{"proc", "*idem.Processor[pgx.Tx]", "a processor"},
	{"metrics", "*idemprom.Metrics", "idemprom.New(registry)"},
	{"h", "http.Handler", "a server's handler"},
	{"url", "string", "a URL to call"},
	{"clientID", "string", "who is calling"},
	{"tp", "trace.TracerProvider", "the application's tracer provider"},
	{"events", "*outbox.Outbox[pgx.Tx]", "an outbox"},
	{"tx", "pgx.Tx", "a handler's transaction"},
	{"store", "*pgxinbox.Store", "an inbox store"},
	{"invoice", "idem.Handler[pgx.Tx]", "a handler"},
}

// givenFile declares the givens code names, in package snippet.
func givenFile(code string) string {
	var decls strings.Builder
	for _, g := range givens {
		if !regexp.MustCompile(`\b` + g.name + `\b`).MatchString(code) {
			continue
		}
		fmt.Fprintf(&decls, "var %s %s // %s\n", g.name, g.decl, g.comment)
	}
	var b strings.Builder
	b.WriteString("package snippet\n\n")
	for _, n := range uses(decls.String()) {
		fmt.Fprintf(&b, "import %s %q\n", n, imports[n])
	}
	b.WriteString(decls.String())
	return b.String()
}

type snippet struct {
	doc  string // path relative to the repository root
	line int    // line of the first line of code
	kind string // "file", "decls" or "stmts"
	code string
}

// extract returns the ```go blocks of the document at root/doc.
func extract(t *testing.T, root, doc string) []snippet {
	t.Helper()
	f, err := os.Open(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out     []snippet
		cur     *snippet
		prev    string
		lineNum int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lineNum++
		l := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			kind := "stmts"
			if strings.TrimSpace(prev) == "<!-- snippet: decls -->" {
				kind = "decls"
			}
			cur = &snippet{doc: doc, line: lineNum + 1, kind: kind}
		case cur != nil && strings.TrimSpace(l) == "```":
			if strings.HasPrefix(strings.TrimSpace(firstCode(cur.code)), "package ") {
				cur.kind = "file"
			}
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += l + "\n"
		}
		if strings.TrimSpace(l) != "" {
			prev = l
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: a ```go block is not closed", doc, cur.line-1)
	}
	return out
}

// firstCode returns the first line of code that is not a comment.
func firstCode(code string) string {
	for l := range strings.SplitSeq(code, "\n") {
		if s := strings.TrimSpace(l); s != "" && !strings.HasPrefix(s, "//") {
			return s
		}
	}
	return ""
}

var (
	comments   = regexp.MustCompile("(?m)//.*$")
	strs       = regexp.MustCompile("`[^`]*`|\"(\\\\.|[^\"\\\\])*\"")
	qualRef    = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Za-z_]`)
	mainClause = regexp.MustCompile(`(?m)^package main\b`)
	topDecl    = regexp.MustCompile(`(?m)^([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*:=`)
)

// uses returns the packages of imports that code refers to.
func uses(code string) []string {
	bare := comments.ReplaceAllString(strs.ReplaceAllString(code, `""`), "")
	seen := map[string]bool{}
	for _, m := range qualRef.FindAllStringSubmatch(bare, -1) {
		if _, ok := imports[m[1]]; ok {
			seen[m[1]] = true
		}
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// source renders a declarations or statements block as a file of package
// snippet, with //line directives that point back into its document.
func source(s snippet) string {
	var b strings.Builder
	b.WriteString("package snippet\n\n")
	for _, n := range uses(s.code) {
		fmt.Fprintf(&b, "import %s %q\n", n, imports[n])
	}
	if s.kind == "decls" {
		fmt.Fprintf(&b, "\n//line %s:%d\n%s", s.doc, s.line, s.code)
		return b.String()
	}
	fmt.Fprintf(&b, "\nfunc _() error {\n//line %s:%d\n%s", s.doc, s.line, s.code)
	for _, m := range topDecl.FindAllStringSubmatch(s.code, -1) {
		for n := range strings.SplitSeq(m[1], ",") {
			if n = strings.TrimSpace(n); n != "_" {
				fmt.Fprintf(&b, "_ = %s\n", n)
			}
		}
	}
	b.WriteString("return nil\n}\n")
	return b.String()
}

// build compiles snippets, each as a package of its own under
// internal/doccheck/snippets in the module that has what it imports, through
// an overlay: nothing is written into the repository. It returns the go
// command's output when the build fails.
func build(t *testing.T, root string, snippets []snippet) (string, error) {
	t.Helper()
	tmp := t.TempDir()
	type module struct {
		dir     string
		overlay map[string]string
		pkgs    []string
	}
	mods := map[string]*module{}
	write := func(name, content string) string {
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for i, s := range snippets {
		modDir := root
		if strings.Contains(s.code, "idemotel.") || strings.Contains(s.code, `"github.com/idemkit/idem/idemotel"`) {
			modDir = filepath.Join(root, "idemotel")
		}
		m := mods[modDir]
		if m == nil {
			m = &module{dir: modDir, overlay: map[string]string{}}
			mods[modDir] = m
		}
		pkg := fmt.Sprintf("internal/doccheck/snippets/s%03d", i)
		dir := filepath.Join(modDir, pkg)
		if s.kind == "file" {
			// A command is built as a library, so that checking it does not
			// link a binary: "main" is an ordinary name outside package main.
			code := mainClause.ReplaceAllString(s.code, "package snippet")
			m.overlay[filepath.Join(dir, "main.go")] = write(fmt.Sprintf("s%03d.go", i), fmt.Sprintf("//line %s:%d\n%s", s.doc, s.line, code))
		} else {
			m.overlay[filepath.Join(dir, "snippet.go")] = write(fmt.Sprintf("s%03d.go", i), source(s))
			m.overlay[filepath.Join(dir, "given.go")] = write(fmt.Sprintf("s%03d_given.go", i), givenFile(s.code))
		}
		m.pkgs = append(m.pkgs, "./"+pkg)
	}
	var failures []string
	for _, m := range mods {
		ov, err := json.Marshal(map[string]any{"Replace": m.overlay})
		if err != nil {
			t.Fatal(err)
		}
		ovPath := write(fmt.Sprintf("overlay-%d.json", len(failures)+len(m.pkgs)), string(ov))
		cmd := exec.Command("go", append([]string{"build", "-overlay", ovPath}, m.pkgs...)...)
		cmd.Dir = m.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			failures = append(failures, fmt.Sprintf("in %s: %v\n%s", m.dir, err, out))
		}
	}
	if len(failures) > 0 {
		return strings.Join(failures, "\n"), fmt.Errorf("%d module(s) failed to build", len(failures))
	}
	return "", nil
}

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func needGo(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH: the documents' snippets are not built")
	}
}

// TestSnippetsCompile builds every ```go block of README.md and docs/*.md.
func TestSnippetsCompile(t *testing.T) {
	needGo(t)
	root := repoRoot(t)
	docs := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range more {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, rel)
	}
	var all []snippet
	for _, d := range docs {
		all = append(all, extract(t, root, d)...)
	}
	if len(all) == 0 {
		t.Fatal("no ```go block found in README.md and docs/: the extraction is broken")
	}
	if out, err := build(t, root, all); err != nil {
		t.Fatalf("a snippet in the documents does not compile (%v):\n%s", err, out)
	}
	t.Logf("%d snippets in %d documents compile", len(all), len(docs))
}

// TestBrokenSnippetFails proves the check can fail: testdata/broken.md has
// a statements block that calls a function idem does not have, and the
// failure names the document and the line.
func TestBrokenSnippetFails(t *testing.T) {
	needGo(t)
	root := repoRoot(t)
	snips := extract(t, root, filepath.Join("internal", "doccheck", "testdata", "broken.md"))
	if len(snips) != 2 {
		t.Fatalf("testdata/broken.md: want 2 blocks, got %d", len(snips))
	}
	if out, err := build(t, root, snips[:1]); err != nil {
		t.Fatalf("the good block of testdata/broken.md does not build: %v\n%s", err, out)
	}
	out, err := build(t, root, snips[1:])
	if err == nil {
		t.Fatal("a block calling idem.NoSuchFunction built without an error")
	}
	want := fmt.Sprintf("%s:%d", filepath.Join("internal", "doccheck", "testdata", "broken.md"), snips[1].line+2)
	if !strings.Contains(out, want) || !strings.Contains(out, "NoSuchFunction") {
		t.Fatalf("the failure does not name %s and the missing function:\n%s", want, out)
	}
}

var link = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)

// TestLinksResolve checks that every relative link of README.md and
// docs/*.md names a file or directory of the repository, so that moving a
// guide or an example cannot leave a dead link behind.
func TestLinksResolve(t *testing.T) {
	root := repoRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	for _, d := range docs {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			for _, m := range link.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				if _, err := os.Stat(filepath.Join(filepath.Dir(d), target)); err != nil {
					rel, _ := filepath.Rel(root, d)
					t.Errorf("%s:%d: the link to %s leads nowhere: %v", rel, i+1, target, err)
				}
			}
		}
	}
}
