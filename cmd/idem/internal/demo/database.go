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

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// side is one of the two consumers' worlds: its own database, gateway and
// counters, fed the same deliveries as the other.
type side struct {
	name    string
	naive   bool
	db      *sql.DB
	dialect sqlinbox.Dialect
	store   *sqlinbox.Store
	gateway *billing.Gateway
	obs     *observer
	procs   map[string]*idem.Processor[*sql.Tx] // stream → processor
	where   string                              // how to inspect it afterwards
}

// observer counts a side's outcomes; it is the processors' idem.OutcomeHook.
type observer struct {
	mu sync.Mutex
	n  map[idem.Outcome]int
}

func (o *observer) OnOutcome(_ string, r idem.Result, _ time.Duration) {
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
// or two databases of those names on the MySQL server at opts.MySQL,
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
	server := opts.Postgres != "" || opts.MySQL != ""
	if !server && dir == "" {
		tmp, err := os.MkdirTemp("", "idem-demo-")
		if err != nil {
			return nil, nil, nil, fmt.Errorf("creating a directory for SQLite: %w", err)
		}
		dir = tmp
		closers = append(closers, func() { _ = os.RemoveAll(tmp) })
	} else if !server {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, nil, nil, fmt.Errorf("creating the SQLite directory: %w", err)
		}
	}
	open := func(name string) (*sql.DB, sqlinbox.Dialect, string, error) {
		if opts.MySQL != "" {
			database := opts.SchemaPrefix + "_" + name
			db, d, err := mysqlDatabase(ctx, opts.MySQL, database, opts.ConnectTimeout)
			return db, d, "database " + database, err
		}
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
		s := &side{name: name, naive: name == "naive", db: db, dialect: dialect, store: store, gateway: billing.NewGateway(),
			obs: &observer{n: map[idem.Outcome]int{}}, procs: map[string]*idem.Processor[*sql.Tx]{}, where: where}
		if s.naive {
			err = billing.MigrateNaive(ctx, db, dialect)
		} else if err = store.Migrate(ctx); err == nil {
			err = billing.Migrate(ctx, db, dialect)
		}
		if err == nil {
			err = billing.For(dialect).SeedStock(ctx, db, p.initialStock)
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
	svc := billing.For(s.dialect)
	cfgs := map[string]*idem.Config[*sql.Tx]{
		streamRenewals: svc.InvoicesConfig(),
		streamPaid:     svc.LedgerConfig(),
		streamPlaced:   svc.InventoryConfig(),
	}
	if s.naive {
		cfgs = map[string]*idem.Config[*sql.Tx]{
			streamRenewals: svc.NaiveInvoicesConfig(s.gateway),
			streamPaid:     svc.NaiveLedgerConfig(),
			streamPlaced:   svc.NaiveInventoryConfig(),
		}
	}
	for stream, cfg := range cfgs {
		cfg.Hooks = append(cfg.Hooks, s.obs)
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

// mysqlDatabase drops and creates database on the MySQL or MariaDB server
// at dsn (the driver's form, user:password@tcp(host:3306)/database, as
// mysqlinbox.Open takes it) and returns a *sql.DB on it, opened as
// mysqlinbox.Open does, with the dialect of the server. Dialing gives up
// after timeout (0: no limit), and so does the first answer, so that a
// server that accepts connections but never answers fails the demo
// instead of hanging it.
func mysqlDatabase(ctx context.Context, dsn, database string, timeout time.Duration) (*sql.DB, sqlinbox.Dialect, error) {
	cfg, err := mysqlinbox.Config(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("the MySQL DSN: %w", err)
	}
	where := "MySQL at " + cfg.Addr
	if timeout > 0 {
		cfg.Timeout = timeout
	}
	ping := func(db *sql.DB) error {
		pctx := ctx
		if timeout > 0 {
			var cancel context.CancelFunc
			pctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		err := db.PingContext(pctx)
		var netErr net.Error
		if err != nil && ctx.Err() == nil && timeout > 0 && (errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout()) {
			return fmt.Errorf("%s did not answer within %v: the server is unreachable or not answering", where, timeout)
		}
		if err != nil {
			return fmt.Errorf("connecting to %s: %w", where, err)
		}
		return nil
	}
	admin := *cfg
	admin.DBName = ""
	conn, err := mysql.NewConnector(&admin)
	if err != nil {
		return nil, nil, fmt.Errorf("the MySQL DSN: %w", err)
	}
	adb := sql.OpenDB(conn)
	defer adb.Close()
	if err := ping(adb); err != nil {
		return nil, nil, err
	}
	q := "`" + database + "`"
	if _, err := adb.ExecContext(ctx, "DROP DATABASE IF EXISTS "+q); err != nil {
		return nil, nil, fmt.Errorf("dropping database %s on %s: %w", database, where, err)
	}
	if _, err := adb.ExecContext(ctx, "CREATE DATABASE "+q); err != nil {
		return nil, nil, fmt.Errorf("creating database %s on %s: %w", database, where, err)
	}
	cfg.DBName = database
	if conn, err = mysql.NewConnector(cfg); err != nil {
		return nil, nil, fmt.Errorf("the MySQL DSN: %w", err)
	}
	db := sql.OpenDB(conn)
	// As on PostgreSQL: room for each side's consumers and their workers.
	db.SetMaxOpenConns(24)
	db.SetMaxIdleConns(24)
	if err := ping(db); err != nil {
		db.Close()
		return nil, nil, err
	}
	d, err := mysqlinbox.Detect(ctx, db)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, d, nil
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
