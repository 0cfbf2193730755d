package netfault_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestProxyFaults drives a real PostgreSQL connection through each fault.
func TestProxyFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := pgtest.Schema(t)
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	p := netfault.New(t, cfg.Host+":"+itoa(cfg.Port))
	url := p.URL(t, base)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	// Frozen: a query never answers; the caller's deadline ends it.
	p.Freeze()
	qctx, qcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = conn.Exec(qctx, "SELECT 1")
	qcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("query through a frozen proxy: %v, want a deadline", err)
	}
	// Frozen: a new connection's connect_timeout runs out.
	if _, err := pgx.Connect(ctx, url+"&connect_timeout=1"); err == nil {
		t.Fatal("connected through a frozen proxy")
	}
	p.Restore()
	again, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("after restore: %v", err)
	}
	defer again.Close(context.Background())

	// Cut: the open connection is reset.
	p.Cut()
	if _, err := again.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("query on a cut connection succeeded")
	}
	// Refused: new connections fail fast.
	p.Refuse()
	if _, err := pgx.Connect(ctx, url); err == nil || p.Refused() == 0 {
		t.Fatalf("connect through a refusing proxy: %v, %d refused", err, p.Refused())
	}
	p.Restore()
	if c, err := pgx.Connect(ctx, url); err != nil {
		t.Fatalf("after restore: %v", err)
	} else {
		c.Close(ctx)
	}
	if p.Accepted() < 3 {
		t.Fatalf("accepted %d connections", p.Accepted())
	}
}

func itoa(n uint16) string { return strconv.Itoa(int(n)) }
