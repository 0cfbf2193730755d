// Package idemmigrate migrates every idem table with one migrator: the inbox
// (plain or partitioned), the outbox, the idempotency keys and the dead-letter
// operators' audit tables. Each table's schema version is recorded in one
// version table, idem_migrations, beside it; every migrator of a database
// takes one lock (PostgreSQL: an advisory lock in the migration transaction;
// MySQL and MariaDB: GET_LOCK on the migration's session; SQLite: BEGIN
// IMMEDIATE) and runs on one connection, so that concurrent deploys queue and
// a pool of one suffices.
//
// A database migrated before the version table recorded every component
// (the outbox's <table>_meta row, an idempotency-keys table that recorded
// nothing) is adopted the first time: the version it recorded its own way is
// taken as applied, and nothing is run again.
//
// Each component keeps its SQL beside its own code, one file per engine and
// migration; [Migrator.Script] renders all of it for a migration tool instead
// (idem ddl).
package idemmigrate

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/dlq"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/internal/migrator"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqlinbox"

	// Registered components.
	_ "github.com/idemkit/idem/idemkey"
	_ "github.com/idemkit/idem/outbox"
)

// The components.
const (
	Inbox           = "inbox"
	Outbox          = "outbox"
	IdempotencyKeys = "idemkey"
	DeadLetters     = "dlq"
)

// Engine is a database: [Postgres], [MySQL] (MySQL 8.0 and MariaDB) or
// [SQLite].
type Engine string

// The engines.
const (
	Postgres Engine = "postgres"
	MySQL    Engine = "mysql"
	SQLite   Engine = "sqlite"
)

// Supported is the components each engine stores, in migration order.
func Supported(e Engine) []string {
	switch e {
	case Postgres:
		return []string{Inbox, Outbox, IdempotencyKeys, DeadLetters}
	case SQLite:
		return []string{Inbox, Outbox}
	case MySQL:
		return []string{Inbox}
	}
	return nil
}

// Config names the tables. The zero Config migrates every component the
// engine supports, under its default table names.
type Config struct {
	// Only limits the migration to these components ([Inbox], [Outbox],
	// [IdempotencyKeys], [DeadLetters]); empty: every one the engine
	// supports.
	Only []string
	// InboxTable is the inbox table (default idem_inbox), optionally
	// schema-qualified on PostgreSQL; the dead-letter audit tables live in
	// its schema. InboxLayout is its layout (PostgreSQL), InboxWindow the
	// retention window a new inbox records (0: the default, 14 days). The
	// daily partitions of a partitioned inbox are not schema: the store's
	// Migrate or EnsurePartitions (idem inbox partitions ensure) creates
	// them.
	InboxTable  string
	InboxLayout idemstore.Layout
	InboxWindow time.Duration
	// OutboxTable is the outbox table (default idem_outbox); OutboxShards
	// the shard count a new outbox records (0: the default).
	OutboxTable  string
	OutboxShards int
	// IdempotencyKeysTable is the keys table (default
	// idem_idempotency_keys).
	IdempotencyKeysTable string
}

// Result is what [Migrator.Migrate] did to one component.
type Result struct {
	Component string
	Table     string
	// From and To are the schema versions before and after: equal when
	// there was nothing to do.
	From, To int
	// Adopted is set when From was read from where the component recorded
	// its version before idem_migrations did.
	Adopted bool
}

// Migrator migrates the idem tables of one database.
type Migrator struct {
	engine Engine
	cfg    Config
	only   []string
	begin  func(ctx context.Context) (migrator.Tx, error)
}

// NewPgx is the migrator of a PostgreSQL database reached through pgx: a
// *pgxpool.Pool or a *pgx.Conn. Migrate holds one of its connections.
func NewPgx(db migrator.PgxDB, cfg *Config) (*Migrator, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: idemmigrate: db is nil", idem.ErrConfig)
	}
	m, err := newMigrator(Postgres, cfg)
	if err != nil {
		return nil, err
	}
	m.begin = func(ctx context.Context) (migrator.Tx, error) { return migrator.BeginPgx(ctx, db) }
	return m, nil
}

// NewSQL is the migrator of a database reached through database/sql. A
// MySQL or MariaDB pool must run its sessions with sql_mode ANSI_QUOTES, as
// the inbox store needs (mysqlinbox.Open does). Migrate holds one of its
// connections.
func NewSQL(db *sql.DB, e Engine, cfg *Config) (*Migrator, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: idemmigrate: db is nil", idem.ErrConfig)
	}
	m, err := newMigrator(e, cfg)
	if err != nil {
		return nil, err
	}
	m.begin = func(ctx context.Context) (migrator.Tx, error) { return migrator.BeginSQL(ctx, db, migrator.Engine(e)) }
	return m, nil
}

// newMigrator validates cfg for e: every component it names, and the table
// names, so that a bad one is refused before a database is touched.
func newMigrator(e Engine, cfg *Config) (*Migrator, error) {
	m := &Migrator{engine: e}
	if cfg != nil {
		m.cfg = *cfg
	}
	supported := Supported(e)
	if supported == nil {
		return nil, fmt.Errorf("%w: idemmigrate: engine %q: want postgres, mysql or sqlite", idem.ErrConfig, e)
	}
	m.only = supported
	if len(m.cfg.Only) > 0 {
		m.only = nil
		for _, c := range supported { // in migration order
			if slices.Contains(m.cfg.Only, c) {
				m.only = append(m.only, c)
			}
		}
		for _, c := range m.cfg.Only {
			if !slices.Contains(supported, c) {
				if !slices.Contains(Supported(Postgres), c) {
					return nil, fmt.Errorf("%w: idemmigrate: unknown component %q: want %s", idem.ErrConfig, c, strings.Join(Supported(Postgres), ", "))
				}
				return nil, fmt.Errorf("%w: idemmigrate: %s has no %s tables (it stores %s)", idem.ErrConfig, e, c, strings.Join(supported, ", "))
			}
		}
	}
	if _, err := m.components(); err != nil {
		return nil, err
	}
	return m, nil
}

// Components is the components Migrate migrates, in order.
func (m *Migrator) Components() []string { return slices.Clone(m.only) }

// components renders the selected components.
func (m *Migrator) components() ([]*migrator.Component, error) {
	var out []*migrator.Component
	for _, name := range m.only {
		var c *migrator.Component
		var err error
		switch name {
		case Inbox:
			c, err = m.inbox()
		case DeadLetters:
			c, err = m.deadLetters()
		case Outbox:
			c, err = migrator.New(Outbox, migrator.Params{Engine: migrator.Engine(m.engine), Table: m.cfg.OutboxTable, Shards: m.cfg.OutboxShards})
		case IdempotencyKeys:
			c, err = migrator.New(IdempotencyKeys, migrator.Params{Engine: migrator.Engine(m.engine), Table: m.cfg.IdempotencyKeysTable})
		}
		if err != nil {
			return nil, fmt.Errorf("idemmigrate: %s: %w", name, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// inboxDialect is the configured inbox table's SQL, the name validated as
// its store validates it.
func (m *Migrator) inboxDialect() (*inboxdb.Dialect, error) {
	name := m.cfg.InboxTable
	if name == "" {
		name = "idem_inbox"
	}
	var err error
	switch m.engine {
	case Postgres:
		_, err = pgxinbox.DDL(name, m.cfg.InboxLayout, m.window())
	case SQLite:
		_, err = sqlinbox.DDL(sqlinbox.SQLite, name, m.window())
	case MySQL:
		_, err = sqlinbox.DDL(sqlinbox.MySQL, name, m.window())
	}
	if err != nil {
		return nil, err
	}
	if m.engine != Postgres && m.cfg.InboxLayout != idemstore.LayoutPlain {
		return nil, fmt.Errorf("%w: %s inboxes have the plain layout", idem.ErrConfig, m.engine)
	}
	t := inboxdb.Table{Name: name}
	if s, n, ok := strings.Cut(name, "."); ok {
		t = inboxdb.Table{Schema: s, Name: n}
	}
	switch m.engine {
	case SQLite:
		return inboxdb.SQLite(t), nil
	case MySQL:
		return inboxdb.MySQL(t), nil
	}
	return inboxdb.Postgres(t, m.cfg.InboxLayout), nil
}

func (m *Migrator) window() time.Duration {
	if m.cfg.InboxWindow == 0 {
		return inboxdb.DefaultWindow
	}
	return m.cfg.InboxWindow
}

func (m *Migrator) inbox() (*migrator.Component, error) {
	d, err := m.inboxDialect()
	if err != nil {
		return nil, err
	}
	b := &inboxdb.Inbox{D: d, Window: m.cfg.InboxWindow}
	return b.Component(new(idemstore.Settings), new(idemstore.MigrateReport))
}

// deadLetters is the dead-letter operators' audit tables (the markers a
// replay retired, and the actions taken on dead letters), beside the inbox
// table: their DDL is dlq's, which also creates them on first use. The
// component is keyed by the retired-markers table.
func (m *Migrator) deadLetters() (*migrator.Component, error) {
	inbox := m.cfg.InboxTable
	if inbox == "" {
		inbox = "idem_inbox"
	}
	retired, err := dlq.AuditDDL(inbox)
	if err != nil {
		return nil, err
	}
	actions, err := dlq.ActionsDDL(inbox)
	if err != nil {
		return nil, err
	}
	t := inboxdb.Table{Name: inbox}
	if s, n, ok := strings.Cut(inbox, "."); ok {
		t = inboxdb.Table{Schema: s, Name: n}
	}
	retiredT, actionsT := t.Sibling(dlq.RetiredTable), t.Sibling(dlq.ActionsTable)
	return &migrator.Component{
		Name:  DeadLetters,
		Table: strings.TrimPrefix(t.Schema+"."+dlq.RetiredTable, "."),
		Key:   retiredT,
		Book:  t.Sibling(migrator.VersionTable),
		Migrations: []migrator.Migration{{
			Version: 1, Name: "0001_dead_letter_audit",
			Statements: append(migrator.Split(retired), migrator.Split(actions)...),
		}},
		Drop: []string{`DROP TABLE IF EXISTS ` + retiredT, `DROP TABLE IF EXISTS ` + actionsT},
		// Created on first use before: both there is version 1; one of
		// them is created again (CREATE TABLE IF NOT EXISTS keeps the
		// other).
		Adopt: func(ctx context.Context, c migrator.Conn) (int, error) {
			var both bool
			if err := c.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`, retiredT, actionsT).Scan(&both); err != nil {
				return 0, err
			}
			if both {
				return 1, nil
			}
			return 0, nil
		},
	}, nil
}

// Migrate brings every selected component to this build's newest schema
// version, in one transaction on one connection under the engine's
// migration lock: all apply, or none. Running it again is a no-op. It
// returns what it did to each component, in order.
func (m *Migrator) Migrate(ctx context.Context) ([]Result, error) {
	return m.run(ctx, true)
}

// GetVersion is each selected component's schema version and this build's
// newest, without migrating anything: Result.From is the version recorded
// (or that would be adopted), Result.To the newest. It waits for the
// migration lock, as a migrator would, and rolls back what it wrote; on
// MySQL and MariaDB, whose DDL commits at once, the empty bookkeeping
// tables it creates to read from stay.
func (m *Migrator) GetVersion(ctx context.Context) ([]Result, error) {
	return m.run(ctx, false)
}

func (m *Migrator) run(ctx context.Context, commit bool) ([]Result, error) {
	comps, err := m.components()
	if err != nil {
		return nil, err
	}
	tx, err := m.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("beginning migration: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	run := migrator.Run
	if !commit {
		// The rollback undoes the version table's creation too.
		run = migrator.Versions
	}
	rs, err := run(ctx, tx, migrator.Engine(m.engine), comps...)
	var out []Result
	for _, r := range rs {
		out = append(out, Result{Component: r.Component, Table: r.Table, From: r.From, To: r.To, Adopted: r.Adopted})
	}
	if err != nil || !commit {
		return out, err
	}
	if err := tx.Commit(ctx); err != nil {
		return out, fmt.Errorf("committing migration: %w", err)
	}
	return out, nil
}
