package pgxinbox_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// The test server is one PostgreSQL with no standby: its defaults keep
// every acknowledged commit; a session that turns synchronous_commit off
// (here through the URL, as a role's setting would) is reported, and a
// consumer starting on it logs the risk.
func TestDurabilityReadsTheSessionsSettings(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Schema(t)
	for _, c := range []struct {
		name, options, risk string
	}{
		{name: "defaults"},
		{name: "synchronous_commit off", options: "&options=-c%20synchronous_commit%3Doff", risk: "synchronous_commit is off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool, err := pgxpool.New(ctx, url+c.options)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			store, err := pgxinbox.New(pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			d, err := store.Durability(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if d.Settings["streaming_standbys"] != "0" {
				t.Skipf("the test server has standbys (%s)", d.Summary())
			}
			var logs bytes.Buffer
			p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
				Consumer: "durability",
				Key:      idem.ByMessageID,
				Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
				Handler:  func(context.Context, pgx.Tx, idem.Message) error { return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Check(ctx); err != nil {
				t.Fatal(err)
			}
			warned := strings.Contains(logs.String(), "acknowledged effects could be lost")
			if c.risk == "" {
				if len(d.Risks) != 0 || warned {
					t.Fatalf("risks %v on a server with defaults (%s); logs:\n%s", d.Risks, d.Summary(), logs.String())
				}
				return
			}
			if len(d.Risks) != 1 || !strings.Contains(d.Risks[0].What, c.risk) {
				t.Fatalf("risks = %v, want one saying %q (%s)", d.Risks, c.risk, d.Summary())
			}
			if !warned || !strings.Contains(logs.String(), c.risk) {
				t.Fatalf("the consumer's start did not warn of %q; logs:\n%s", c.risk, logs.String())
			}
			// The adapters check again after every outage: the same risks
			// are not logged again.
			if err := p.Check(ctx); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(logs.String(), "acknowledged effects could be lost"); n != 1 {
				t.Fatalf("the warning was logged %d times over two checks; logs:\n%s", n, logs.String())
			}
		})
	}
}
