package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/demo/billing"
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
// files in opts.SQLiteDir (a temporary directory when empty), or two schemas
// (prefix_naive, prefix_idem) of the PostgreSQL database at opts.Postgres,
// dropped first if they exist. closeAll closes them and removes a temporary
// directory; on error, openSides has already done so.
func openSides(ctx context.Context, opts *Options, p *plan) (naive, safe *side, closeAll func(), err error) {
	var closers []func()
	closeOpened := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeOpened()
		}
	}()
	dir := opts.SQLiteDir
	if opts.Postgres == "" && dir == "" {
		tmp, err := os.MkdirTemp("", "idem-demo-")
		if err != nil {
			return nil, nil, nil, fmt.Errorf("creating a directory for SQLite: %w", err)
		}
		dir = tmp
		closers = append(closers, func() { _ = os.RemoveAll(tmp) })
	} else if opts.Postgres == "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, nil, nil, fmt.Errorf("creating the SQLite directory: %w", err)
		}
	}
	open := func(name string) (*sql.DB, sqlinbox.Dialect, string, error) {
		if opts.Postgres == "" {
			path := filepath.Join(dir, name+".db")
			if opts.SQLiteDir != "" {
				// Fresh files, as the PostgreSQL schemas are recreated.
				for _, f := range []string{path, path + "-wal", path + "-shm"} {
					if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
						return nil, nil, "", err
					}
				}
			}
			db, err := sqliteinbox.Open(path)
			where := path
			if opts.SQLiteDir == "" {
				where = "" // removed at the end of the run
			}
			return db, sqlinbox.SQLite, where, err
		}
		schema := opts.SchemaPrefix + "_" + name
		db, err := postgresSchema(ctx, opts.Postgres, schema, opts.ConnectTimeout)
		return db, sqlinbox.Postgres, "schema " + schema, err
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
	return sides[0], sides[1], closeOpened, nil
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
// returns a *sql.DB whose connections use it. Every connection attempt,
// including the first, gives up after timeout (0: no limit), so a server
// that accepts connections but never answers fails the demo instead of
// hanging it.
func postgresSchema(ctx context.Context, rawURL, schema string, timeout time.Duration) (*sql.DB, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("the PostgreSQL URL must start with postgres://, got %q", redact(rawURL))
	}
	v := u.Query()
	v.Set("search_path", schema)
	u.RawQuery = v.Encode()
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("the PostgreSQL URL %s: %w", redact(rawURL), err)
	}
	cfg.ConnectTimeout = timeout
	db := stdlib.OpenDB(*cfg)
	// Each side runs three consumers with a few workers each; leave room
	// on a server with the default max_connections.
	db.SetMaxOpenConns(24)
	db.SetMaxIdleConns(24)
	where := fmt.Sprintf("PostgreSQL at %s", hostPort(cfg.Host, cfg.Port))
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		if ctx.Err() == nil && timeout > 0 && (pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)) {
			return nil, fmt.Errorf("%s did not answer within %v: the server is unreachable or not answering", where, timeout)
		}
		return nil, fmt.Errorf("connecting to %s: %w", where, connectCause(err))
	}
	// search_path names the schema before it exists; PostgreSQL resolves it
	// per statement, so the statements below create what the pool uses.
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+q+" CASCADE"); err != nil {
		db.Close()
		return nil, fmt.Errorf("dropping schema %s on %s: %w", schema, where, err)
	}
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+q); err != nil {
		db.Close()
		return nil, fmt.Errorf("creating schema %s on %s: %w", schema, where, err)
	}
	return db, nil
}

// connectCause is the part of a failed connection's error that says why:
// the server's refusal (a wrong password, a missing database) or the
// network's (connection refused), rather than pgx's attempt-by-attempt
// account of each address and TLS mode it tried.
func connectCause(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return opErr
	}
	// A host that does not resolve: the lookup's own error, once, rather
	// than pgx's account of it per attempt.
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr
	}
	return err
}

func hostPort(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}
