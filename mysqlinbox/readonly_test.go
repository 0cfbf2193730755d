package mysqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/mysqlinbox"
)

// TestReadOnlyServerIsAnOutage: a server fenced read-only (SET GLOBAL
// read_only = 1, how a failover fences the old primary) refuses the
// claim's INSERT (a natural consumer's: its handler's own write) with 1290
// to every user without SUPER or READ_ONLY ADMIN, as the consumer's user
// is. The processor holds the message as an outage, spending none of its
// attempts, both on a database opened with mysqlinbox.Open, whose
// rejectReadOnly drops each refused connection (the next try dials again),
// and on one opened without it, where the store sees the server's 1290
// itself.
func TestReadOnlyServerIsAnOutage(t *testing.T) {
	ctx := context.Background()
	cfg := mysqltest.Database(t, "idem_t_")
	root, err := mysqlinbox.Open(cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close() })
	migrated(t, root, nil)
	if _, err := root.ExecContext(ctx, `CREATE TABLE effects (message_id VARBINARY(255))`); err != nil {
		t.Fatal(err)
	}
	// A user of the test database only: no global privilege, so read_only
	// binds it. The name is the database's, unique to this test.
	user := cfg.DBName
	for _, q := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw'",
		"GRANT ALL ON " + cfg.DBName + ".* TO '" + user + "'@'%'",
	} {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Skipf("cannot create a user without SUPER to fence out (%s): %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = root.ExecContext(ctx, "DROP USER '"+user+"'@'%'") })
	var readOnly int
	if err := root.QueryRowContext(ctx, "SELECT @@GLOBAL.read_only").Scan(&readOnly); err != nil || readOnly != 0 {
		t.Skipf("the test server is read-only already (%d, %v)", readOnly, err)
	}
	userCfg := cfg.Clone()
	userCfg.User, userCfg.Passwd = user, "pw"

	for _, reject := range []bool{true, false} {
		name := "rejectReadOnly"
		if !reject {
			name = "without rejectReadOnly"
		}
		t.Run(name, func(t *testing.T) {
			c, err := mysqlinbox.Config(userCfg.FormatDSN())
			if err != nil {
				t.Fatal(err)
			}
			c.RejectReadOnly = reject
			conn, err := mysql.NewConnector(c)
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(conn)
			defer db.Close()
			db.SetMaxOpenConns(1)
			store, err := mysqlinbox.New(db, nil)
			if err != nil {
				t.Fatal(err)
			}
			procs := map[string]*idem.Processor[*sql.Tx]{}
			for _, natural := range []bool{false, true} {
				c := &idem.Config[*sql.Tx]{
					Consumer: "readonly-" + strconv.FormatBool(reject),
					Key:      idem.ByMessageID,
					Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
						_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES (?)`, m.ID)
						return err
					},
					// One attempt: a failure charged to the message dead-letters it.
					Retry:  idem.RetryPolicy{MaxAttempts: 1, WaitUnavailable: 300 * time.Millisecond},
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				}
				kind := "claiming"
				if natural {
					// No claim: the handler's own write meets the refusal.
					kind, c.Consumer, c.Key, c.Natural = "natural", c.Consumer+"-natural", nil, true
				}
				if procs[kind], err = idem.NewProcessor(store, c); err != nil {
					t.Fatal(err)
				}
			}
			var before int64
			if err := db.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&before); err != nil {
				t.Fatal(err)
			}

			if _, err := root.ExecContext(ctx, "SET GLOBAL read_only = 1"); err != nil {
				t.Skipf("cannot fence the server read-only: %v", err)
			}
			restored := false
			restore := func() {
				if !restored {
					restored = true
					if _, err := root.ExecContext(context.Background(), "SET GLOBAL read_only = 0"); err != nil {
						t.Errorf("restoring read_only = 0: %v", err)
					}
				}
			}
			t.Cleanup(restore)
			// The refusal is the server's, as the consumer's user meets it.
			tx, err := store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = claim(t, store, tx, 0, "probe")
			_ = tx.Rollback()
			if err == nil {
				t.Fatal("a claim on the read-only server succeeded: the user is not bound by read_only")
			}
			if c := store.Classify(err); c != idemstore.ClassUnavailable {
				t.Errorf("claim on a read-only server: %v, class %v, want unavailable", err, c)
			}
			if !reject && !strings.Contains(err.Error(), "1290") {
				t.Errorf("claim on a read-only server without rejectReadOnly: %v, want the server's 1290", err)
			}

			for _, kind := range []string{"claiming", "natural"} {
				res := procs[kind].Process(ctx, idem.Message{ID: "m-1", Body: []byte("x"), Time: time.Now()})
				if res.Outcome != idem.Retry || !res.Blameless || !errors.Is(res.Err, idem.ErrUnavailable) {
					t.Fatalf("%s: outcome %v blameless %v err %v; want a blameless Retry wrapping ErrUnavailable", kind, res.Outcome, res.Blameless, res.Err)
				}
				if res.Attempts < 2 {
					t.Fatalf("%s: %d tries; want the outage waited out with several", kind, res.Attempts)
				}
			}
			restore()
			var after int64
			if err := db.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&after); err != nil {
				t.Fatal(err)
			}
			if reject && after == before {
				t.Errorf("connection %d still in use after the server refused its writes; want it dropped", after)
			}
			// Once the fence is lifted, the message applies.
			for _, kind := range []string{"claiming", "natural"} {
				if res := procs[kind].Process(ctx, idem.Message{ID: "m-1", Body: []byte("x"), Time: time.Now()}); res.Outcome != idem.Applied {
					t.Fatalf("%s, after read_only = 0: outcome %v (%v), want applied", kind, res.Outcome, res.Err)
				}
			}
		})
	}
}
