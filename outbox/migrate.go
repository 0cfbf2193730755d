package outbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/migrator"
)

// migrationFS holds the numbered migration templates of each dialect
// (0001_outbox.sql, 0002_…). A released migration is never edited: a
// change is a new file.
//
//go:embed migrations
var migrationFS embed.FS

// migrations renders the dialect's templates for the outbox table, in
// version order.
func (c *core) migrations() ([]migrator.Migration, error) {
	t := c.table
	data := struct{ Table, Leases, Relays string }{t.Quoted(), t.Sibling(t.Name + "_leases"), t.Sibling(t.Name + "_relays")}
	funcs := template.FuncMap{"index": func(column string) string { return `"` + t.IndexName(column) + `"` }}
	return migrator.Load(migrationFS, c.s.migrations, data, funcs)
}

// MigrateReport says what Migrate did.
type MigrateReport struct {
	Table    string // the outbox table
	Created  bool   // the table was new
	From, To int    // schema versions before and after
	Shards   int    // the stored shard count
}

// Migrate creates the outbox table and its siblings, or brings them to
// the newest schema version, in one transaction serialized against other
// migrators; running it again is a no-op. A new table stores
// Config.Shards (DefaultShards when 0); an existing one keeps its count,
// and a different non-zero Config.Shards is refused.
func (c *core) migrateReport(ctx context.Context) (MigrateReport, error) {
	r, err := c.migrate(ctx)
	if err != nil {
		return r, fmt.Errorf("migrating outbox table %s: %w", c.table, err)
	}
	c.mu.Lock()
	c.shards = r.Shards
	c.mu.Unlock()
	return r, nil
}

func (c *core) migrate(ctx context.Context) (r MigrateReport, err error) {
	r.Table = c.table.String()
	comp, err := c.component(&r)
	if err != nil {
		return r, err
	}
	tx, err := c.drv.BeginMigration(ctx)
	if err != nil {
		return r, fmt.Errorf("beginning migration: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, err := migrator.Apply(ctx, tx, migrator.Engine(c.s.name), comp)
	if err != nil {
		return r, err
	}
	r.From, r.To = res.From, res.To
	if err := tx.Commit(ctx); err != nil {
		return r, fmt.Errorf("committing migration: %w", err)
	}
	return r, nil
}

// component is the outbox table as the one migrator of every idem table
// sees it. The version is recorded in the version table; the <table>_meta
// row, where it was recorded before, keeps the shard count and follows the
// version, and is read once to adopt a table migrated before. Once it has
// run, *r says what it did.
func (c *core) component(r *MigrateReport) (*migrator.Component, error) {
	ms, err := c.migrations()
	if err != nil {
		return nil, err
	}
	r.Table, r.To = c.table.String(), len(ms)
	return &migrator.Component{
		Name:       "outbox",
		Table:      c.table.String(),
		Key:        c.table.Quoted(),
		Book:       c.table.Sibling(migrator.VersionTable),
		Migrations: ms,
		Drop: []string{
			`DROP TABLE IF EXISTS ` + c.table.Quoted(),
			`DROP TABLE IF EXISTS ` + c.table.Sibling(c.table.Name+"_leases"),
			`DROP TABLE IF EXISTS ` + c.table.Sibling(c.table.Name+"_relays"),
			`DROP TABLE IF EXISTS ` + c.table.Sibling(c.table.Name+"_meta"),
		},
		Setup: func(ctx context.Context, conn migrator.Conn) error {
			if _, err := conn.Exec(ctx, c.s.meta); err != nil {
				return fmt.Errorf("creating the meta table: %w", err)
			}
			return nil
		},
		Adopt: func(ctx context.Context, conn migrator.Conn) (int, error) {
			var v, shards int
			if err := conn.QueryRow(ctx, c.s.readMeta).Scan(&v, &shards); err != nil && !isNoRows(err) {
				return 0, err
			}
			return v, nil
		},
		After: func(ctx context.Context, conn migrator.Conn, from, to int) error {
			r.From, r.To = from, to
			return c.recordMeta(ctx, conn, r, to)
		},
	}, nil
}

// recordMeta writes the meta row of a new table (the version and the shard
// count, with the shards' leases), or checks the shard count of an existing
// one and brings its version up to date.
func (c *core) recordMeta(ctx context.Context, conn migrator.Conn, r *MigrateReport, version int) error {
	var metaVersion int
	found := true
	if err := conn.QueryRow(ctx, c.s.readMeta).Scan(&metaVersion, &r.Shards); err != nil {
		if !isNoRows(err) {
			return fmt.Errorf("reading the shard count: %w", err)
		}
		found = false
	}
	r.Created = !found
	switch {
	case !found:
		r.Shards = c.cfg.Shards
		if r.Shards == 0 {
			r.Shards = DefaultShards
		}
		if _, err := conn.Exec(ctx, c.s.insertMeta, version, r.Shards); err != nil {
			return fmt.Errorf("recording the shard count: %w", err)
		}
		for shard := range r.Shards {
			if _, err := conn.Exec(ctx, c.s.insertLease, shard, c.s.timeArg(never)); err != nil {
				return fmt.Errorf("creating the shard leases: %w", err)
			}
		}
	case c.cfg.Shards != 0 && c.cfg.Shards != r.Shards:
		return fmt.Errorf("%w: the configured shard count %d differs from the %d stored with the table; leave Shards unset to use the stored one",
			idem.ErrConfig, c.cfg.Shards, r.Shards)
	case metaVersion < version:
		// An older idem reads its version here.
		if _, err := conn.Exec(ctx, c.s.updateMeta, version); err != nil {
			return fmt.Errorf("recording the schema version: %w", err)
		}
	}
	return nil
}

func init() {
	migrator.Register("outbox", func(p migrator.Params) (*migrator.Component, error) {
		switch p.Engine {
		case migrator.Postgres, migrator.SQLite:
		default:
			return nil, fmt.Errorf("%w: the outbox runs on PostgreSQL and SQLite, not on %s", idem.ErrConfig, p.Engine)
		}
		c, err := newCore(string(p.Engine), nil, &Config{Table: p.Table, Shards: p.Shards})
		if err != nil {
			return nil, err
		}
		return c.component(&MigrateReport{})
	})
}

// isNoRows reports the "no rows" error of pgx or database/sql.
func isNoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}
