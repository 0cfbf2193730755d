package console

import (
	"bytes"
	"context"
	"html"
	"html/template"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// chromium finds Debian's chromium: $IDEM_CHROMIUM, /usr/bin/chromium, or
// chromium on the PATH.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IDEM_CHROMIUM"); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Skip("chromium is not installed: the browser test needs a headless Chromium; install it with bash scripts/chromium.sh (apt-get install chromium, as make test does) or set IDEM_CHROMIUM")
	return ""
}

// browse runs a headless Chromium on url with args (--dump-dom,
// --screenshot=...) and returns its stdout.
func browse(t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--no-first-run", "--hide-scrollbars", "--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, bin, append(append(base, args...), url)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", url, err, errb.String())
	}
	return out.String()
}

// submitPage is a page that fills and sends a form as an operator would:
// the fields of the console's confirmation form, the operator's, and a
// script that presses the button once the page loaded.
var submitPage = template.Must(template.New("").Parse(`<!doctype html><html><body>
<form method="post" action="{{.Action}}">{{range $k, $v := .Fields}}<input type="hidden" name="{{$k}}" value="{{index $v 0}}">{{end}}
<button type="submit">send</button></form>
<script>addEventListener("load", () => document.forms[0].requestSubmit());</script>
</body></html>`))

func submitter(t *testing.T, action string, fields map[string][]string) http.Handler {
	t.Helper()
	var b bytes.Buffer
	if err := submitPage.Execute(&b, map[string]any{"Action": action, "Fields": fields}); err != nil {
		t.Fatal(err)
	}
	var page atomic.Pointer[[]byte]
	body := b.Bytes()
	page.Store(&body)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(*page.Load())
	})
}

// TestBrowser renders the console's pages in a real headless Chromium,
// redrives a group through its form as the browser sends it, sees a
// cross-origin form refused, and with IDEM_CONSOLE_SCREENSHOTS=dir writes
// the screenshots of docs/dead-letters.md there.
func TestBrowser(t *testing.T) {
	bin := chromium(t)
	e := newEnv(t)
	e.seed(60, []string{"inv-9001", "inv-9002", "inv-9003"})
	srv, _ := e.server("s3cret-token", false)
	// One origin for the console and the operator's submitting page.
	mux := http.NewServeMux()
	mux.Handle("/", srv)
	var submit atomic.Pointer[http.Handler]
	mux.HandleFunc("/operator/submit", func(w http.ResponseWriter, r *http.Request) {
		if h := submit.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		http.NotFound(w, r)
	})
	ts := httptest.NewServer(mux)
	defer ts.Close()
	shots := os.Getenv("IDEM_CONSOLE_SCREENSHOTS")
	shot := func(name, path, size string) {
		if shots == "" {
			return
		}
		if err := os.MkdirAll(shots, 0o755); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(shots, name)
		browse(t, bin, ts.URL+path, "--screenshot="+f, "--window-size="+size)
		if st, err := os.Stat(f); err != nil || st.Size() < 10_000 {
			t.Fatalf("screenshot %s: %v", f, err)
		}
	}

	dom := browse(t, bin, ts.URL+"/", "--dump-dom")
	if got := markersCell(dom, consumer); got != "60/9" {
		t.Errorf("rendered overview: markers/untimed of %s %q, want 60/9\n%s", consumer, got, dom)
	}
	if !strings.Contains(dom, `<span class="total">4</span> letters`) || !regexp.MustCompile(`<td class="n count">3</td>`).MatchString(dom) {
		t.Errorf("rendered overview: want 4 letters, a group of 3\n%s", dom)
	}
	if !strings.Contains(dom, `data-state="duplicates"`) || !strings.Contains(dom, `data-state="ok"`) {
		t.Errorf("rendered overview: guard states missing")
	}
	shot("overview.png", "/", "1280,1000")

	dom = browse(t, bin, ts.URL+"/dlq/0/show?id=inv-9002", "--dump-dom")
	if !strings.Contains(dom, `id="verdict">apply</span>`) || !strings.Contains(dom, "tax rate missing for region EU-HR") {
		t.Errorf("rendered show page lacks the verdict or the reason\n%s", dom)
	}
	shot("show.png", "/dlq/0/show?id=inv-9002", "1200,900")

	link := regexp.MustCompile(`href="(/dlq/0/redrive\?[^"]*tax[^"]*)"`).FindStringSubmatch(browse(t, bin, ts.URL+"/", "--dump-dom"))
	if link == nil {
		t.Fatal("no redrive link for the tax-rate group in the rendered overview")
	}
	preview := html.UnescapeString(link[1])
	dom = browse(t, bin, ts.URL+preview, "--dump-dom")
	if !strings.Contains(dom, "Dry run: <strong>3</strong> letters match") || !strings.Contains(dom, `<form class="confirm"`) {
		t.Fatalf("rendered preview: want a dry run of 3 and the confirmation form\n%s", dom)
	}
	shot("redrive.png", preview, "1200,900")
	if n := e.settledDepth(e.topo.DeadLetterQueue, 4); n != 4 {
		t.Fatalf("rendering the pages changed the DLQ: %d letters, want 4", n)
	}

	form := formOf(t, dom)
	form.Set("by", "ops@example.com")
	form.Set("why", "INC-42: tax rates for EU-HR added")
	form.Set("token", "s3cret-token")

	// The same form sent from another origin (another port) is refused by
	// the browser's own Sec-Fetch-Site and Origin.
	evil := httptest.NewServer(submitter(t, ts.URL+"/dlq/0/redrive", form))
	defer evil.Close()
	dom = browse(t, bin, evil.URL, "--dump-dom", "--virtual-time-budget=10000")
	if !strings.Contains(dom, "cross-origin request may not change anything") {
		t.Errorf("cross-origin form: not refused\n%s", dom)
	}
	if n := e.settledDepth(e.topo.DeadLetterQueue, 4); n != 4 {
		t.Fatalf("a cross-origin form changed the DLQ: %d letters, want 4", n)
	}

	// The operator's form, same origin: the browser sends it and the
	// console redrives.
	h := submitter(t, "/dlq/0/redrive", form)
	submit.Store(&h)
	dom = browse(t, bin, ts.URL+"/operator/submit", "--dump-dom", "--virtual-time-budget=10000")
	if !strings.Contains(dom, "redriven 3 of 3") {
		t.Fatalf("redrive through the browser: want redriven 3 of 3\n%s", dom)
	}
	if n := e.settledDepth(e.topo.DeadLetterQueue, 1); n != 1 {
		t.Errorf("DLQ holds %d after the redrive, want 1", n)
	}
	e.consume(3, nil)
	for _, id := range []string{"inv-9001", "inv-9002", "inv-9003"} {
		if n := e.effects(id); n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	dom = browse(t, bin, ts.URL+"/?reread=1", "--dump-dom")
	if !strings.Contains(dom, "INC-42: tax rates for EU-HR added") || !strings.Contains(dom, `<span class="total">1</span> letters`) {
		t.Errorf("rendered overview after the redrive lacks the action or the new total\n%s", dom)
	}
	if got := markersCell(dom, consumer); got != "63/9" {
		t.Errorf("rendered overview after the redrive: markers/untimed %q, want 63/9", got)
	}
	shot("overview-after-redrive.png", "/", "1280,1000")
}
