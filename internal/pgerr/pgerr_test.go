package pgerr

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgtest"
)

func pg(severity, code string) error {
	return fmt.Errorf("running statement: %w", &pgconn.PgError{Severity: severity, SeverityUnlocalized: severity, Code: code})
}

func TestClassifyAndCommitUnknown(t *testing.T) {
	cases := []struct {
		name    string
		err     error
		class   idemstore.ErrorClass
		unknown bool // as a COMMIT's error
	}{
		{"unique violation", pg("ERROR", "23505"), idemstore.ClassPermanent, false},
		{"division by zero", pg("ERROR", "22012"), idemstore.ClassPermanent, false},
		{"index row too large", pg("ERROR", "54000"), idemstore.ClassPermanent, false},
		{"too many columns", pg("ERROR", "54011"), idemstore.ClassPermanent, false},
		{"serialization failure", pg("ERROR", "40001"), idemstore.ClassBusy, false},
		{"deadlock", pg("ERROR", "40P01"), idemstore.ClassBusy, false},
		{"lock timeout", pg("ERROR", "55P03"), idemstore.ClassBusy, false},
		{"undefined table", pg("ERROR", "42P01"), idemstore.ClassConfig, false},
		{"insufficient privilege", pg("ERROR", "42501"), idemstore.ClassConfig, false},
		{"unknown database", pg("FATAL", "3D000"), idemstore.ClassConfig, true},
		{"password authentication failed", pg("FATAL", "28P01"), idemstore.ClassConfig, true},
		{"undefined column", pg("ERROR", "42703"), idemstore.ClassTransient, false},
		{"idle in transaction timeout", pg("FATAL", "25P03"), idemstore.ClassTransient, true},
		{"statement timeout", pg("ERROR", "57014"), idemstore.ClassTransient, false},
		{"read-only server", pg("ERROR", "25006"), idemstore.ClassUnavailable, false},
		{"admin shutdown", pg("FATAL", "57P01"), idemstore.ClassUnavailable, true},
		{"connection failure", pg("FATAL", "08006"), idemstore.ClassUnavailable, true},
		{"too many connections", pg("FATAL", "53300"), idemstore.ClassUnavailable, true},
		{"commit answered rollback", pgx.ErrTxCommitRollback, idemstore.ClassTransient, false},
		{"transaction already done", sql.ErrTxDone, idemstore.ClassTransient, false},
		{"connection closed", fmt.Errorf("committing: %w", pgconn.ErrConnClosed), idemstore.ClassUnavailable, true},
		{"EOF", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), idemstore.ClassUnavailable, true},
		{"a handler's own error", errors.New("payment gateway said 503"), idemstore.ClassTransient, true},
	}
	for _, c := range cases {
		if got := Classify(c.err); got != c.class {
			t.Errorf("%s: Classify = %v, want %v", c.name, got, c.class)
		}
		if got := CommitUnknown(c.err); got != c.unknown {
			t.Errorf("%s: CommitUnknown = %v, want %v", c.name, got, c.unknown)
		}
	}
}

// TestRealErrors classifies errors from a real server: a refused
// connection and a terminated backend are unavailable, a unique violation
// is permanent.
func TestRealErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	if err == nil || Classify(err) != idemstore.ClassUnavailable {
		t.Fatalf("refused connection %v: class %v, want unavailable", err, Classify(err))
	}
	url := pgtest.Schema(t)
	victim, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(ctx)
	var pid int
	if err := victim.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	killer, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close(ctx)
	if _, err := killer.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	_, err = victim.Exec(ctx, "SELECT 1")
	if err == nil || Classify(err) != idemstore.ClassUnavailable {
		t.Fatalf("terminated backend %v: class %v, want unavailable", err, Classify(err))
	}
	_, err = killer.Exec(ctx, "CREATE TEMP TABLE u (k int PRIMARY KEY); INSERT INTO u VALUES (1), (1)")
	if Classify(err) != idemstore.ClassPermanent {
		t.Fatalf("unique violation %v: class %v, want permanent", err, Classify(err))
	}
}

// TestRealConfigAndTimeoutErrors classifies what a real server and a real
// network give: an unknown database and a missing table are configuration
// errors; a server that accepts the connection and never answers, under
// connect_timeout, is unavailable — not a transient error of the message's.
func TestRealConfigAndTimeoutErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:5432/idem_no_such_db?sslmode=disable&connect_timeout=5")
	if err == nil || Classify(err) != idemstore.ClassConfig {
		t.Fatalf("unknown database %v: class %v, want config", err, Classify(err))
	}
	conn, err := pgx.Connect(ctx, pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "INSERT INTO idem_no_such_table VALUES (1)")
	if err == nil || Classify(err) != idemstore.ClassConfig {
		t.Fatalf("undefined table %v: class %v, want config", err, Classify(err))
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accept, then say nothing
		}
	}()
	url := "postgres://postgres@" + ln.Addr().String() + "/test?sslmode=disable&connect_timeout=1"
	_, err = pgx.Connect(ctx, url)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && Classify(err) != idemstore.ClassUnavailable {
		t.Fatalf("silent server: %v", err)
	}
	if Classify(err) != idemstore.ClassUnavailable {
		t.Fatalf("connect timeout %v: class %v, want unavailable", err, Classify(err))
	}
}

// TestRealReadOnly classifies the error a server that cannot write gives: a
// session with default_transaction_read_only (how a failover fences a
// demoted primary, and what a hot standby answers alike) refuses an INSERT
// with 25006, an outage rather than the message's fault; the COMMIT of the
// failed transaction is a known rollback.
func TestRealReadOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["default_transaction_read_only"] = "on"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if got := conn.PgConn().ParameterStatus("default_transaction_read_only"); got != "on" {
		t.Fatalf("server reports default_transaction_read_only=%q, want on", got)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "CREATE TEMP TABLE ro (k int)")
	if !ReadOnly(err) || Classify(err) != idemstore.ClassUnavailable {
		t.Fatalf("write on a read-only session %v: class %v, want unavailable (25006)", err, Classify(err))
	}
	err = tx.Commit(ctx)
	if err == nil || CommitUnknown(err) {
		t.Fatalf("commit after 25006: %v, unknown %v; want a known rollback", err, CommitUnknown(err))
	}
}
