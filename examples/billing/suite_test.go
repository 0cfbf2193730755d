package billing_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// TestEveryConsumer runs idemtest's three checks (delivered twice, delivered
// concurrently, crash after commit) on every billing consumer, on both
// databases: the incident's "a test for every consumer", with the list
// of consumers taken from the code that wires them.
func TestEveryConsumer(t *testing.T) {
	var wired []string
	for _, c := range billing.Consumers() {
		wired = append(wired, c.Consumer)
	}
	samples := map[string]any{
		billing.InvoicesConsumer:  renewal,
		billing.LedgerConsumer:    billing.OrderPaid{EventID: "evt-1", OrderID: "ord-1", MerchantID: "mer-1", Amount: 12_500},
		billing.InventoryConsumer: billing.OrderPlaced{EventID: "evt-2", OrderID: "ord-1", ProductID: "sku-1", Quantity: 3},
		billing.StatsConsumer:     renewal,
	}
	for _, dbName := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(dbName, func(t *testing.T) {
			t.Parallel()
			var suite idemtest.Suite[*sql.Tx]
			services := billing.For(nil)
			if dbName == "mysql" {
				services = billing.For(sqlinbox.MySQL)
			}
			for _, cfg := range services.Consumers() {
				suite.Register(cfg.Consumer, idemtest.Case[*sql.Tx]{
					Sample: message(t, cfg.Consumer+"-sample", samples[cfg.Consumer]),
					Setup: func(t testing.TB, faults idem.FaultFunc) (*idem.Processor[*sql.Tx], idemtest.Snapshotter) {
						e := openEnv(t, dbName)
						c := *cfg
						c.Faults = faults
						p, err := idem.NewProcessor(e.store, &c)
						if err != nil {
							t.Fatal(err)
						}
						return p, e.snap
					},
				})
			}
			idemtest.ForEachConsumer(t, &suite, wired...)
		})
	}
}

// openEnv is a fresh database of the given kind with the billing tables.
func openEnv(t testing.TB, kind string) *env {
	t.Helper()
	var (
		db   *sql.DB
		err  error
		d    sqlinbox.Dialect
		snap func(*sql.DB) idemtest.Snapshotter
	)
	switch kind {
	case "sqlite":
		db, err = sqliteinbox.Open(filepath.Join(t.TempDir(), "billing.db"))
		d, snap = sqlinbox.SQLite, func(db *sql.DB) idemtest.Snapshotter { return idemtest.SQLite(db, nil) }
	case "mysql":
		db, err = mysqlinbox.Open(mysqltest.Database(t, "idem_billing_").FormatDSN())
		if err == nil {
			d, err = mysqlinbox.Detect(t.Context(), db)
		}
		snap = func(db *sql.DB) idemtest.Snapshotter { return idemtest.MySQL(db, nil) }
	default:
		db, err = sql.Open("pgx", pgtest.Schema(t))
		d, snap = sqlinbox.Postgres, func(db *sql.DB) idemtest.Snapshotter { return idemtest.PostgresSQL(db, nil) }
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return setup(t, db, d, false, snap(db))
}
