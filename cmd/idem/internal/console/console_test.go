package console

import (
	"context"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// markersCell is a consumer's marker count in the overview.
func markersCell(page, name string) string {
	re := regexp.MustCompile(`data-consumer="` + regexp.QuoteMeta(name) + `">\s*<td><strong>[^<]*</strong></td>\s*<td class="n markers">(\d+)</td>\s*<td class="n untimed">(\d+)</td>`)
	m := re.FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return m[1] + "/" + m[2]
}

func TestPagesRender(t *testing.T) {
	e := newEnv(t)
	e.seed(21, []string{"inv-9001", "inv-9002"})
	s, ts := e.server("", false)

	// The charts' bars add up to the markers of their spans.
	in, err := s.Consumers(context.Background())
	if err != nil || len(in.Consumers) != 1 {
		t.Fatalf("consumers %+v, %v", in, err)
	}
	c := in.Consumers[0]
	var hours, days, n int64
	for _, b := range c.Hours {
		hours += b.Count
	}
	for _, b := range c.Days {
		days += b.Count
	}
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_inbox WHERE processed_at >= $1`, c.Hours[0].Start).Scan(&n); err != nil || n != hours {
		t.Errorf("hour bars add up to %d, want %d (%v)", hours, n, err)
	}
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_inbox WHERE processed_at >= $1`, c.Days[0].Start).Scan(&n); err != nil || n != days {
		t.Errorf("day bars add up to %d, want %d (%v)", days, n, err)
	}
	if hours == 0 || hours == days {
		t.Errorf("seeded markers: %d in the last 24 hours, %d in 14 days: want some in each and some only in the days", hours, days)
	}

	code, page := get(t, ts, "/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, page)
	}
	var markers, untimed int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE event_time IS NULL) FROM idem_inbox WHERE consumer = $1`, consumer).Scan(&markers, &untimed); err != nil {
		t.Fatal(err)
	}
	if markers != 21 || untimed != 3 {
		t.Fatalf("seeded %d markers, %d untimed; want 21 and 3", markers, untimed)
	}
	if got := markersCell(page, consumer); got != "21/3" {
		t.Errorf("consumer %s: markers/untimed %q, want 21/3\n%s", consumer, got, page)
	}
	// The poisoned group: two letters, their IDs in the reason written <id>.
	group := regexp.MustCompile(`<td class="n count">(\d+)</td>\s*<td>` + consumer + `</td>\s*<td class="reason">([^<]*)</td>`)
	groups := map[string]string{}
	for _, m := range group.FindAllStringSubmatch(page, -1) {
		groups[html.UnescapeString(m[2])] = m[1]
	}
	var tax, malformed string
	for reason, n := range groups {
		switch {
		case strings.Contains(reason, "tax rate missing") && strings.Contains(reason, "<id>"):
			tax = n
		case strings.Contains(reason, "unexpected end of JSON"):
			malformed = n
		}
	}
	if tax != "2" || malformed != "1" {
		t.Errorf("DLQ groups %v: want the tax-rate group with 2 and the malformed one with 1", groups)
	}
	if !strings.Contains(page, `<span class="total">3</span> letters`) {
		t.Errorf("the DLQ's total is not 3")
	}
	// Dead letters of the consumer, from the DLQ.
	if !regexp.MustCompile(`<td class="n dead">3`).MatchString(page) {
		t.Errorf("consumer %s: dead letters not 3", consumer)
	}
	// Guarded tables: invoices has a duplicate and no index, payments is fenced.
	for table, state := range map[string]string{"invoices": "duplicates", "payments": "ok"} {
		if !regexp.MustCompile(`data-state="` + state + `">\s*<td><code>[^<]*` + table + `</code>`).MatchString(page) {
			t.Errorf("guard %s: not in state %s", table, state)
		}
	}
	if strings.Contains(page, "<form") || strings.Contains(page, "actions on") {
		t.Errorf("a console without a token offers actions")
	}

	code, page = get(t, ts, "/dlq/0/show?id=inv-9001")
	if code != http.StatusOK {
		t.Fatalf("show: %d\n%s", code, page)
	}
	for _, want := range []string{`id="verdict">apply</span>`, "tax rate missing for region EU-HR", `{&#34;invoice&#34;:&#34;inv-9001&#34;`, e.topo.Queue} {
		if !strings.Contains(page, want) {
			t.Errorf("show page lacks %q", want)
		}
	}
	if code, _ := get(t, ts, "/dlq/0/show?id=inv-0001"); code != http.StatusNotFound {
		t.Errorf("show of an applied message: %d, want 404", code)
	}
	// A dry run without a token previews and offers no form.
	code, page = get(t, ts, "/dlq/0/redrive?consumer="+consumer+"&id=inv-9002")
	if code != http.StatusOK || !strings.Contains(page, "Dry run: <strong>1</strong> letters match") || strings.Contains(page, "<form") {
		t.Errorf("preview without a token: %d\n%s", code, page)
	}
	if n := e.settledDepth(e.topo.DeadLetterQueue, 3); n != 3 {
		t.Errorf("reading the pages changed the DLQ: %d letters, want 3", n)
	}
}

// redriveGroup opens the redrive preview of the tax-rate group and returns
// its form.
func redriveGroup(t *testing.T, e *env, base string, get func(string) (int, string)) url.Values {
	t.Helper()
	code, page := get("/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d", code)
	}
	link := regexp.MustCompile(`href="(/dlq/0/redrive\?[^"]*tax[^"]*)"`).FindStringSubmatch(page)
	if link == nil {
		t.Fatalf("no redrive link for the tax-rate group\n%s", page)
	}
	code, page = get(html.UnescapeString(link[1]))
	if code != http.StatusOK {
		t.Fatalf("preview: %d\n%s", code, page)
	}
	if !strings.Contains(page, "Dry run: <strong>2</strong> letters match") {
		t.Fatalf("preview does not match the group's 2 letters\n%s", page)
	}
	if n := e.settledDepth(e.topo.DeadLetterQueue, 3); n != 3 {
		t.Fatalf("the dry run changed the DLQ: %d letters, want 3", n)
	}
	return formOf(t, page)
}

func TestRedriveThroughThePage(t *testing.T) {
	e := newEnv(t)
	e.seed(5, []string{"inv-9001", "inv-9002"})
	_, ts := e.server("s3cret-token", false)
	form := redriveGroup(t, e, ts.URL, func(p string) (int, string) { return get(t, ts, p) })
	if got := form.Get("ids"); got != "inv-9001,inv-9002" {
		t.Fatalf("form IDs %q, want inv-9001,inv-9002", got)
	}
	form.Set("token", "s3cret-token")
	form.Set("by", "ops@example.com")
	form.Set("why", "INC-42 tax rates fixed")
	code, page := post(t, ts, "/dlq/0/redrive", form, nil)
	if code != http.StatusOK || !strings.Contains(page, "redriven 2 of 2") {
		t.Fatalf("redrive: %d\n%s", code, page)
	}
	if n := e.settledDepth(e.topo.DeadLetterQueue, 1); n != 1 {
		t.Errorf("DLQ holds %d after the redrive, want 1 (the malformed letter)", n)
	}
	if n := e.depth(e.topo.Queue); n != 2 {
		t.Errorf("work queue holds %d, want the 2 redriven", n)
	}
	// The handler is fixed: each redriven message is applied once.
	e.consume(2, nil)
	for _, id := range []string{"inv-9001", "inv-9002"} {
		if n := e.effects(id); n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	// The action is in the actions table and on the page.
	acts, err := e.inbox.Actions(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(acts) != 1 || acts[0].By != "ops@example.com" || acts[0].Op != "redrive" || acts[0].Done != 2 || strings.Join(acts[0].IDs, ",") != "inv-9001,inv-9002" || acts[0].Why != "INC-42 tax rates fixed" {
		t.Fatalf("actions %+v, want one redrive of 2 by ops@example.com", acts)
	}
	_, page = get(t, ts, "/?reread=1")
	if !strings.Contains(page, "INC-42 tax rates fixed") || !strings.Contains(page, `<span class="total">1</span> letters`) {
		t.Errorf("overview after the redrive lacks the action or the new total")
	}
	// Sending the same form again finds nothing to redrive.
	code, page = post(t, ts, "/dlq/0/redrive", form, nil)
	if code != http.StatusOK || !strings.Contains(page, "redriven 0 of 0") {
		t.Errorf("second redrive: %d\n%s", code, page)
	}
}

func TestWritesRefused(t *testing.T) {
	e := newEnv(t)
	e.seed(2, []string{"inv-9001", "inv-9002"})
	s, ts := e.server("s3cret-token", false)
	form := redriveGroup(t, e, ts.URL, func(p string) (int, string) { return get(t, ts, p) })
	form.Set("by", "mallory")
	with := func(k, v string) url.Values {
		f := url.Values{}
		for k, vs := range form {
			f[k] = vs
		}
		f.Set(k, v)
		return f
	}
	good := with("token", "s3cret-token")
	for _, c := range []struct {
		name string
		form url.Values
		mod  func(*http.Request)
		want string
	}{
		{"no token", form, nil, "token is missing or wrong"},
		{"wrong token", with("token", "guess"), nil, "token is missing or wrong"},
		{"forged form token", func() url.Values { f := with("token", "s3cret-token"); f.Set("form", "AAAA.BBBB"); return f }(), nil, "form is stale"},
		{"form token of another DLQ", func() url.Values {
			f := with("token", "s3cret-token")
			f.Set("form", s.formToken(1, s.cfg.Now()))
			return f
		}(), nil, "form is stale"},
		{"cross-site fetch", good, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }, "cross-origin"},
		{"cross-origin Origin", good, func(r *http.Request) {
			r.Header.Del("Sec-Fetch-Site")
			r.Header.Set("Origin", "http://evil.example")
		}, "cross-origin"},
		{"foreign Referer", good, func(r *http.Request) {
			r.Header.Del("Sec-Fetch-Site")
			r.Header.Del("Origin")
			r.Header.Set("Referer", "http://evil.example/page")
		}, "another site"},
	} {
		code, page := post(t, ts, "/dlq/0/redrive", c.form, c.mod)
		if code != http.StatusForbidden || !strings.Contains(page, c.want) {
			t.Errorf("%s: %d, want 403 saying %q\n%s", c.name, code, c.want, page)
		}
	}
	if code, _ := get(t, ts, "/dlq/0/redrive?id=inv-9001&consumer="+consumer); code != http.StatusOK {
		t.Errorf("a GET of the preview: %d", code)
	}
	// Another site's page may link to the console but not load it.
	for _, c := range []struct {
		mode, dest string
		want       int
	}{{"no-cors", "image", http.StatusForbidden}, {"cors", "empty", http.StatusForbidden}, {"navigate", "iframe", http.StatusForbidden}, {"navigate", "document", http.StatusOK}} {
		req, err := http.NewRequest(http.MethodGet, ts.URL+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.Header.Set("Sec-Fetch-Mode", c.mode)
		req.Header.Set("Sec-Fetch-Dest", c.dest)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("cross-site GET, mode %s, dest %s: %d, want %d", c.mode, c.dest, resp.StatusCode, c.want)
		}
	}
	// A name rebound to the console's address is not answered, not even a
	// read.
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		req, err := http.NewRequest(m, ts.URL+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "rebound.evil.example"
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s with Host rebound.evil.example: %d, want 403", m, resp.StatusCode)
		}
	}
	s2, err := New(Config{Inbox: e.inbox, DB: e.pool, Hosts: []string{"console.internal"}, Logger: s.cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]int{"console.internal:8080": http.StatusOK, "[::1]:8080": http.StatusOK, "localhost": http.StatusOK, "other.internal": http.StatusForbidden} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Host = host
		s2.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("GET with Host %s: %d, want %d", host, rec.Code, want)
		}
	}
	// Read-only, and without a token: refused even with the right token.
	for _, srv := range []struct {
		name     string
		token    string
		readOnly bool
		want     string
	}{{"read-only", "s3cret-token", true, "read-only"}, {"no token", "", false, "has no token"}} {
		_, ts2 := e.server(srv.token, srv.readOnly)
		code, page := post(t, ts2, "/dlq/0/redrive", good, nil)
		if code != http.StatusForbidden || !strings.Contains(page, srv.want) {
			t.Errorf("%s console: %d, want 403 saying %q", srv.name, code, srv.want)
		}
		_, page = get(t, ts2, "/dlq/0/redrive?id=inv-9001&consumer="+consumer)
		if strings.Contains(page, "<form") {
			t.Errorf("%s console offers a confirmation form", srv.name)
		}
	}
	if n := e.settledDepth(e.topo.DeadLetterQueue, 3); n != 3 {
		t.Errorf("refused writes changed the DLQ: %d letters, want 3", n)
	}
	if n := e.depth(e.topo.Queue); n != 0 {
		t.Errorf("refused writes published %d messages", n)
	}
	acts, err := e.inbox.Actions(context.Background(), 10)
	if err != nil || len(acts) != 0 {
		t.Errorf("refused writes recorded actions: %v %v", acts, err)
	}
	// The same form with the token, same-origin, goes through.
	code, page := post(t, ts, "/dlq/0/redrive", good, nil)
	if code != http.StatusOK || !strings.Contains(page, "redriven 2 of 2") {
		t.Errorf("the good request: %d\n%s", code, page)
	}
}
