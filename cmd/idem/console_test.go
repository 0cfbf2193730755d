package main

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

func TestConsoleUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--guard", "invoices"}, "want table:column"},
		{[]string{"--guard", "invoices:customer_id;colour=red"}, "unknown setting colour"},
		{[]string{"--listen", "8080"}, "--listen \"8080\": want host:port"},
		{[]string{"--topic", "billing.dlq", "--brokers", ""}, "--topic needs --brokers"},
		{[]string{"--table", "bad name"}, "--table"},
		{[]string{"--rate", "-1"}, "--rate must not be negative"},
	} {
		args := append([]string{"console"}, c.args...)
		t.Setenv("IDEM_KAFKA_BROKERS", "")
		r := cli(t, args...)
		r.expect(t, exitUsage, args)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("idem %s: stderr %q, want it to say %q", strings.Join(args, " "), r.stderr, c.want)
		}
	}
	r := cli(t, "console", "-h")
	r.expect(t, exitOK, []string{"console", "-h"})
	for _, flag := range []string{"--guard", "--token", "--read-only", "--listen", "--queue", "--topic"} {
		if !strings.Contains(r.stdout, flag) {
			t.Errorf("console -h lacks %s", flag)
		}
	}
}

// The console serves the DLQ from the command line: pages render, a write
// without the token is refused, a redrive with it goes through, and
// SIGINT's cancellation stops it with exit 0.
func TestConsoleServes(t *testing.T) {
	e := newDLQEnv(t)
	at := time.Now().Add(-time.Hour)
	e.letter(t, "inv-1", "handling message inv-1: tax rate missing", at)
	e.letter(t, "inv-2", "handling message inv-2: tax rate missing", at)
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE invoices (id bigserial PRIMARY KEY, customer_id int NOT NULL, period text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx, stop := context.WithCancel(ctx)
	var out, errb syncBuffer
	t.Setenv("IDEM_CONSOLE_TOKEN", "tok-123")
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"console", "--key", "id", "--database", e.db, "--listen", "127.0.0.1:0", "--queue", e.topo.DeadLetterQueue,
			"--guard", "invoices:customer_id,period;status=-"}, &out, &errb)
	}()
	var base string
	for deadline := time.Now().Add(time.Minute); base == ""; {
		if m := regexp.MustCompile(`serving (http://[^/]+)/ \(actions allowed with the token\)`).FindStringSubmatch(out.String()); m != nil {
			base = m[1]
			if !strings.Contains(out.String(), "; database: PostgreSQL postgres") {
				t.Errorf("the serving line names no database: %s", out.String())
			}
			break
		}
		select {
		case code := <-done:
			t.Fatalf("idem console exited %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("idem console did not serve within a minute\nstdout: %s\nstderr: %s", out.String(), errb.String())
		}
	}
	fetch := func(method, path string, form url.Values) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", base)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, page := fetch(http.MethodGet, "/", nil)
	if code != http.StatusOK || !strings.Contains(page, `<span class="total">2</span> letters`) || !strings.Contains(page, `data-state="unguarded"`) {
		t.Fatalf("GET /: %d\n%s", code, page)
	}
	code, page = fetch(http.MethodGet, "/dlq/0/redrive?consumer=billing-invoice&reason="+url.QueryEscape("handling message <id>: tax rate missing"), nil)
	if code != http.StatusOK || !strings.Contains(page, "Dry run: <strong>2</strong>") {
		t.Fatalf("preview: %d\n%s", code, page)
	}
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`).FindAllStringSubmatch(page, -1) {
		form.Set(m[1], strings.ReplaceAll(strings.ReplaceAll(m[2], "&lt;", "<"), "&gt;", ">"))
	}
	form.Set("by", "ops")
	if code, _ := fetch(http.MethodPost, "/dlq/0/redrive", form); code != http.StatusForbidden {
		t.Errorf("POST without the token: %d, want 403", code)
	}
	if n := e.depth(t, e.topo.DeadLetterQueue); n != 2 {
		t.Errorf("a refused POST changed the DLQ: %d letters", n)
	}
	form.Set("token", "tok-123")
	code, page = fetch(http.MethodPost, "/dlq/0/redrive", form)
	if code != http.StatusOK || !strings.Contains(page, "redriven 2 of 2") {
		t.Fatalf("POST with the token: %d\n%s", code, page)
	}
	if n := e.depth(t, e.topo.Queue); n != 2 {
		t.Errorf("work queue holds %d, want the 2 redriven", n)
	}
	stop()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("idem console exited %d after the interruption, want 0\nstderr: %s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("idem console did not stop within 30s of the interruption")
	}
	if !strings.Contains(errb.String(), "console: redrive") || !strings.Contains(errb.String(), "by=ops") {
		t.Errorf("the redrive is not logged\nstderr: %s", errb.String())
	}
}

// The console shows a JetStream dead-letter stream named by --stream on
// --nats, and reading it leaves the letters there.
func TestConsoleServesNATS(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, js := natsLetters(t, ctx)
	db := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(rctx, []string{"console", "--key", "id", "--database", db, "--listen", "127.0.0.1:0", "--nats", srv.URL(), "--stream", "ORDERS_DLQ"}, &out, &errb)
	}()
	var base string
	for deadline := time.Now().Add(time.Minute); base == ""; {
		if m := regexp.MustCompile(`serving (http://[^/]+)/`).FindStringSubmatch(out.String()); m != nil {
			base = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("idem console exited %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("idem console did not serve within a minute\nstdout: %s\nstderr: %s", out.String(), errb.String())
		}
	}
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if page := string(b); resp.StatusCode != http.StatusOK || !strings.Contains(page, `<span class="total">2</span> letters`) || !strings.Contains(page, "ORDERS_DLQ") {
		t.Fatalf("GET /: %d\n%s", resp.StatusCode, page)
	}
	s, err := js.Stream(ctx, "ORDERS_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 2 {
		t.Fatalf("ORDERS_DLQ after the console read it: %+v %v; want its 2 letters", info, err)
	}
	stop()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("idem console exited %d, want 0\nstderr: %s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("idem console did not stop within 30s of its cancel")
	}
}
