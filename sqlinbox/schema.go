package sqlinbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
)

// DDL returns the SQL [Store.Migrate] runs for table on dialect, for a
// migration tool (golang-migrate, goose, Atlas, Flyway) to run instead: the
// bookkeeping tables, every migration of this build, the schema version
// and the settings row recording the plain layout and window (14 days when
// 0), so that a later Migrate, `idem inbox check` or a consumer's start
// finds the table up to date. It is rendered from the migration files
// Migrate applies. On PostgreSQL it is the DDL of package pgxinbox's plain
// layout. An empty table is [DefaultTable].
//
// On PostgreSQL the SQL is safe to run again (each migration runs only on a
// table below its version). SQLite has no conditional DDL: apply its SQL
// once, as migration tools do; after an upgrade of idem, `idem inbox ddl
// --dialect sqlite --from-version N` renders only the newer migrations.
func DDL(d Dialect, table string, window time.Duration) (string, error) {
	sc, err := script(d, table, window)
	if err != nil {
		return "", err
	}
	return sc.UpSQL(), nil
}

// DownDDL returns the SQL that removes what [DDL] created: the table and
// its rows in the bookkeeping tables (on PostgreSQL the bookkeeping tables
// go too once no other inbox is recorded in them; SQLite keeps them).
func DownDDL(d Dialect, table string) (string, error) {
	sc, err := script(d, table, 0)
	if err != nil {
		return "", err
	}
	return sc.DownSQL(), nil
}

func script(d Dialect, table string, window time.Duration) (inboxdb.Script, error) {
	if d == nil {
		return inboxdb.Script{}, fmt.Errorf("%w: sqlinbox: dialect is nil (use sqlinbox.Postgres or sqlinbox.SQLite)", idem.ErrConfig)
	}
	if table == "" {
		table = DefaultTable
	}
	t, err := parseTable(table, d.schemas())
	if err != nil {
		return inboxdb.Script{}, fmt.Errorf("%w: sqlinbox: %w", idem.ErrConfig, err)
	}
	sc, err := d.statements(inboxdb.Table{Schema: t.schema, Name: t.name}).Script(window, 0)
	if err != nil {
		return sc, fmt.Errorf("sqlinbox: rendering the DDL of %s: %w", table, err)
	}
	return sc, nil
}

// Check verifies the inbox table ([idemstore.Store.Check]): it exists with the
// inbox's columns, its unique key on (consumer, key) and its keep_until
// index, its stored layout and a sane window, at this build's schema
// version (an older one needs Migrate; a newer one means this binary is
// older than the one that migrated it). Each problem comes with its fix.
func (s *Store) Check(ctx context.Context) ([]idemstore.SchemaProblem, error) {
	probs, err := s.inbox.Check(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlinbox: %w", err)
	}
	return probs, nil
}
