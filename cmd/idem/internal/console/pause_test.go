package console

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// The consumers page pauses and resumes a consumer with the console token
// and a fresh form, keeping who and why in the audit table; without them
// it changes nothing.
func TestPauseAndResumeThroughThePage(t *testing.T) {
	e := newEnv(t)
	s, err := New(Config{Inbox: e.inbox, DB: e.pool, Pauses: e.store, Token: "s3cret-token",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	ctx := context.Background()

	code, page := get(t, ts, "/consumers")
	if code != http.StatusOK || !strings.Contains(page, `id="none"`) {
		t.Fatalf("consumers page: %d\n%s", code, page)
	}
	if code, page := get(t, ts, "/"); code != http.StatusOK || !strings.Contains(page, `href="/consumers"`) {
		t.Fatalf("the overview links no consumers page: %d", code)
	}
	form := url.Values{"form": {regexp.MustCompile(`name="form" value="([^"]+)"`).FindStringSubmatch(page)[1]},
		"consumer": {consumer}, "by": {"alice"}, "why": {"incident 42"}}
	// Without the token, with a forged form, without why: refused, and
	// nothing is paused.
	for _, c := range []struct {
		name string
		mod  func(url.Values)
		want int
	}{
		{"no token", func(url.Values) {}, http.StatusForbidden},
		{"forged form", func(f url.Values) { f.Set("token", "s3cret-token"); f.Set("form", "AAAA.BBBB") }, http.StatusForbidden},
		{"redrive form", func(f url.Values) { f.Set("token", "s3cret-token"); f.Set("form", s.formToken(0, s.cfg.Now())) }, http.StatusForbidden},
		{"no why", func(f url.Values) { f.Set("token", "s3cret-token"); f.Del("why") }, http.StatusBadRequest},
	} {
		f := url.Values{}
		for k, v := range form {
			f[k] = append([]string(nil), v...)
		}
		c.mod(f)
		if code, page := post(t, ts, "/consumers/pause", f, nil); code != c.want {
			t.Errorf("%s: %d, want %d\n%s", c.name, code, c.want, page)
		}
	}
	if p, err := e.store.Paused(ctx, consumer); err != nil || p.Paused {
		t.Fatalf("paused by a refused request: %+v, %v", p, err)
	}

	form.Set("token", "s3cret-token")
	code, page = post(t, ts, "/consumers/pause", form, nil)
	if code != http.StatusOK || !strings.Contains(page, `id="outcome"`) || !strings.Contains(page, "incident 42") {
		t.Fatalf("pause: %d\n%s", code, page)
	}
	if p, err := e.store.Paused(ctx, consumer); err != nil || !p.Paused || p.By != "alice" || p.Why != "incident 42" {
		t.Fatalf("after the pause: %+v, %v", p, err)
	}
	form.Set("why", "fixed")
	if code, page := post(t, ts, "/consumers/resume", form, nil); code != http.StatusOK || !strings.Contains(page, "resumed") {
		t.Fatalf("resume: %d\n%s", code, page)
	}
	if code, _ := post(t, ts, "/consumers/resume", form, nil); code != http.StatusConflict {
		t.Fatalf("resuming twice: %d", code)
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM idem_consumer_pause_log WHERE actor = 'alice'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("audit rows: %d (%v), want a pause and a resume", n, err)
	}
}
