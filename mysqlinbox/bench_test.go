package mysqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/sqlinbox"
)

// BenchmarkClaim measures messages per second for claim plus a one-row
// business write on the test server (MariaDB) with the MySQL dialect (two
// statements per claim after a SET) and the MariaDB one (one statement),
// next to PostgreSQL in the same run, all through sqlinbox: one transaction
// per message and batches of 100, and the same write without a claim
// (noclaim) as each database's own baseline. The +interpolate variants open
// the database with interpolateParams=true, the driver option Open turns
// off, to show what that choice costs or saves.
//
//	go test -run '^$' -bench Claim -benchtime 2s ./mysqlinbox/
func BenchmarkClaim(b *testing.B) {
	backends := []struct {
		name    string
		dialect sqlinbox.Dialect
		open    func(b *testing.B) *sql.DB
	}{
		{"postgres", sqlinbox.Postgres, func(b *testing.B) *sql.DB {
			db, err := sql.Open("pgx", pgtest.Schema(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = db.Close() })
			return db
		}},
		{"mysql", sqlinbox.MySQL, func(b *testing.B) *sql.DB { return freshDB(b) }},
		{"mariadb", sqlinbox.MariaDB, func(b *testing.B) *sql.DB { return freshDB(b) }},
		// interpolateParams=true: the driver splices escaped arguments into
		// the text, one round trip per statement instead of a prepare and
		// an execute; measured beside Open's default (false).
		{"mysql+interpolate", sqlinbox.MySQL, interpolatedDB},
		{"mariadb+interpolate", sqlinbox.MariaDB, interpolatedDB},
	}
	onServer := dialects(b)
	for _, be := range backends {
		if be.dialect != sqlinbox.Postgres && !slices.Contains(onServer, be.dialect) {
			continue
		}
		b.Run(be.name, func(b *testing.B) {
			ctx := context.Background()
			db := be.open(b)
			store, err := sqlinbox.New(db, be.dialect, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `CREATE TABLE ledger (merchant_id int, amount bigint, message_id text)`); err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			next := func() idem.Message {
				return idem.Message{ID: "evt-" + strconv.FormatInt(seq.Add(1), 10), Body: []byte(`{"merchant_id":1,"amount":12500}`)}
			}
			for _, batch := range []int{1, 100} {
				for _, natural := range []bool{false, true} {
					name := map[bool]string{false: "claim", true: "noclaim"}[natural]
					b.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(b *testing.B) {
						p := benchProcessor(b, store, fmt.Sprintf("bench-%s-%d", name, batch), natural)
						msgs := make([]idem.Message, batch)
						n := 0
						for b.Loop() {
							for i := range msgs {
								msgs[i] = next()
							}
							var rs []idem.Result
							if batch == 1 {
								rs = []idem.Result{p.Process(ctx, msgs[0])}
							} else {
								rs = p.ProcessBatch(ctx, msgs)
							}
							for _, r := range rs {
								if r.Outcome != idem.Applied {
									b.Fatalf("%s: %v %v", r.MessageID, r.Outcome, r.Err)
								}
							}
							n += batch
						}
						b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
					})
				}
			}
		})
	}
}

// benchProcessor writes one ledger row per message, all of a transaction's
// rows in one statement.
func benchProcessor(b *testing.B, store *sqlinbox.Store, consumer string, natural bool) *idem.Processor[*sql.Tx] {
	ph := func(n int) string { return "$" + strconv.Itoa(n) }
	if store.Dialect() != sqlinbox.Postgres {
		ph = func(int) string { return "?" }
	}
	cfg := &idem.Config[*sql.Tx]{
		Consumer: consumer,
		Natural:  natural,
		HandleBatch: func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
			var q strings.Builder
			q.WriteString(`INSERT INTO ledger VALUES `)
			args := make([]any, len(msgs))
			for i, m := range msgs {
				if i > 0 {
					q.WriteByte(',')
				}
				q.WriteString("(1, 12500, " + ph(i+1) + ")")
				args[i] = m.ID
			}
			_, err := tx.ExecContext(ctx, q.String(), args...)
			return err
		},
	}
	if !natural {
		cfg.Key = idem.ByMessageID
	}
	p, err := idem.NewProcessor(store, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// interpolatedDB is freshDB with interpolateParams=true.
func interpolatedDB(b *testing.B) *sql.DB {
	cfg, err := mysqlinbox.Config(mysqltest.Database(b, "idem_t_").FormatDSN())
	if err != nil {
		b.Fatal(err)
	}
	cfg.InterpolateParams = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		b.Fatal(err)
	}
	db := sql.OpenDB(conn)
	b.Cleanup(func() { _ = db.Close() })
	return db
}
