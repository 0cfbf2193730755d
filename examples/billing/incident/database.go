package incident

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// side is one of the two consumers' worlds: its own database, gateway and
// counters, fed the same deliveries as the other.
type side struct {
	name    string
	naive   bool
	db      *sql.DB
	store   *sqlinbox.Store
	gateway *billing.Gateway
	obs     *observer
	procs   map[string]*idem.Processor[*sql.Tx] // stream → processor
	where   string                              // how to inspect it afterwards
}

// observer counts a side's outcomes; it is the processors' idem.Observer.
type observer struct {
	mu sync.Mutex
	n  map[idem.Outcome]int
}

func (o *observer) Observe(_ string, r idem.Result, _ time.Duration) {
	o.mu.Lock()
	o.n[r.Outcome]++
	o.mu.Unlock()
}

func (o *observer) count(out idem.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}

// openSides creates the naive and the idem databases, fresh: two SQLite
// files in dir, or two schemas (prefix_naive, prefix_idem) of the PostgreSQL
// database at pgURL, dropped first if they exist.
func openSides(ctx context.Context, opts *Options, p *plan) (naive, safe *side, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	open := func(name string) (*sql.DB, sqlinbox.Dialect, string, error) {
		if opts.Postgres == "" {
			path := filepath.Join(opts.dir, name+".db")
			db, err := sqliteinbox.Open(path)
			return db, sqlinbox.SQLite, path, err
		}
		schema := opts.SchemaPrefix + "_" + name
		db, err := postgresSchema(ctx, opts.Postgres, schema)
		return db, sqlinbox.Postgres, "schema " + schema, err
	}
	if opts.Postgres == "" && opts.dir == "" {
		dir, err := os.MkdirTemp("", "idem-demo-")
		if err != nil {
			return nil, nil, nil, fmt.Errorf("creating a directory for SQLite: %w", err)
		}
		opts.dir = dir
		closers = append(closers, func() { _ = os.RemoveAll(dir) })
	}
	sides := make([]*side, 2)
	for i, name := range []string{"naive", "idem"} {
		db, dialect, where, err := open(name)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("opening the %s database: %w", name, err)
		}
		closers = append(closers, func() { _ = db.Close() })
		store, err := sqlinbox.New(db, dialect, nil)
		if err != nil {
			return nil, nil, nil, err
		}
		s := &side{name: name, naive: name == "naive", db: db, store: store, gateway: billing.NewGateway(),
			obs: &observer{n: map[idem.Outcome]int{}}, procs: map[string]*idem.Processor[*sql.Tx]{}, where: where}
		if s.naive {
			err = billing.MigrateNaive(ctx, db, dialect)
		} else if err = store.Migrate(ctx); err == nil {
			err = billing.Migrate(ctx, db, dialect)
		}
		if err == nil {
			err = billing.SeedStock(ctx, db, p.initialStock)
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("preparing the %s database: %w", name, err)
		}
		if err := s.processors(opts); err != nil {
			return nil, nil, nil, err
		}
		sides[i] = s
	}
	return sides[0], sides[1], closeAll, nil
}

func (s *side) processors(opts *Options) error {
	cfgs := map[string]*idem.Config[*sql.Tx]{
		streamRenewals: billing.InvoicesConfig(),
		streamPaid:     billing.LedgerConfig(),
		streamPlaced:   billing.InventoryConfig(),
	}
	if s.naive {
		cfgs = map[string]*idem.Config[*sql.Tx]{
			streamRenewals: billing.NaiveInvoicesConfig(s.gateway),
			streamPaid:     billing.NaiveLedgerConfig(),
			streamPlaced:   billing.NaiveInventoryConfig(),
		}
	}
	for stream, cfg := range cfgs {
		cfg.Observer = s.obs
		cfg.Logger = opts.Logger
		p, err := idem.NewProcessor(s.store, cfg)
		if err != nil {
			return fmt.Errorf("building the %s %s consumer: %w", s.name, stream, err)
		}
		s.procs[stream] = p
	}
	return nil
}

// postgresSchema drops and creates schema in the database at rawURL and
// returns a *sql.DB whose connections use it.
func postgresSchema(ctx context.Context, rawURL, schema string) (*sql.DB, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("--postgres must be a postgres:// URL, got %q", rawURL)
	}
	admin, err := sql.Open("pgx", rawURL)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	defer admin.Close()
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := admin.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+q+" CASCADE"); err != nil {
		return nil, fmt.Errorf("dropping schema %s: %w", schema, err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+q); err != nil {
		return nil, fmt.Errorf("creating schema %s: %w", schema, err)
	}
	v := u.Query()
	v.Set("search_path", schema)
	u.RawQuery = v.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	// Each side runs three consumers with a few workers each; leave room
	// on a server with the default max_connections.
	db.SetMaxOpenConns(24)
	db.SetMaxIdleConns(24)
	return db, nil
}
