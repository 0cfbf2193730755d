package console

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/pgxinbox"
)

// A console that has been running since before a prune judges with the
// summaries the prune wrote: a letter whose key's marker the prune
// deleted is shown as expire (a late duplicate), not apply, and its
// redrive refuses to send it.
func TestPruneUnderRunningConsole(t *testing.T) {
	e := newEnv(t)
	e.seed(2, []string{"inv-9001", "inv-9002"})
	ctx := context.Background()
	// An earlier copy of inv-9001 was applied a month ago: its marker is
	// past the window, due for the next prune.
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, processed_at, keep_until)
		VALUES ($1, 'inv-9001', 'inv-9001', '\x00', now() - interval '30 days', now() - interval '30 days')`, consumer); err != nil {
		t.Fatal(err)
	}
	_, ts := e.server("s3cret-token", false)
	verdict := func(id string) string {
		t.Helper()
		code, page := get(t, ts, "/dlq/0/show?id="+id)
		if code != http.StatusOK {
			t.Fatalf("show %s: %d\n%s", id, code, page)
		}
		_, v, ok := strings.Cut(page, `id="verdict">`)
		if !ok {
			t.Fatalf("show %s: no verdict\n%s", id, page)
		}
		v, _, _ = strings.Cut(v, "<")
		return v
	}
	if v := verdict("inv-9002"); v != "apply" {
		t.Fatalf("inv-9002 before the prune: %s, want apply", v)
	}
	if v := verdict("inv-9001"); v != "duplicate" {
		t.Fatalf("inv-9001 before the prune: %s, want duplicate", v)
	}
	res, err := e.store.Prune(ctx, pgxinbox.PruneOptions{})
	if err != nil || res.Markers != 1 {
		t.Fatalf("prune: %+v %v, want the 1 old marker", res, err)
	}
	if v := verdict("inv-9001"); v != "expire" {
		t.Errorf("inv-9001 after the prune: %s, want expire (its marker is in the prune's summary)", v)
	}
	code, page := get(t, ts, "/dlq/0/redrive?consumer="+consumer+"&id=inv-9001")
	if code != http.StatusOK {
		t.Fatalf("preview: %d\n%s", code, page)
	}
	form := formOf(t, page)
	form.Set("token", "s3cret-token")
	form.Set("by", "ops@example.com")
	form.Set("why", "INC-43")
	code, page = post(t, ts, "/dlq/0/redrive", form, nil)
	if code != http.StatusOK || !strings.Contains(page, "redriven 0 of 1") {
		t.Errorf("redrive of the pruned key: %d, want it refused\n%s", code, page)
	}
	if n := e.settledDepth(e.topo.DeadLetterQueue, 3); n != 3 {
		t.Errorf("DLQ holds %d, want all 3 letters", n)
	}
	if n := e.depth(e.topo.Queue); n != 0 {
		t.Errorf("work queue holds %d, want nothing sent", n)
	}
}
