package pgxinbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
)

// DDL returns the SQL [Store.Migrate] runs for table in layout, for a
// migration tool (golang-migrate, goose, Atlas, Flyway) to run instead: the
// bookkeeping tables, every migration of this build, the schema version
// and the settings row recording layout and window (14 days when 0), so
// that a later Migrate, `idem inbox check` or a consumer's start finds the
// table up to date. It is rendered from the migration files Migrate
// applies. An empty table is "idem_inbox".
//
// The SQL is safe to run again: the migrations run in one PL/pgSQL block,
// each only on a table below its version, and an existing table keeps its
// stored settings. So after an upgrade of idem, a new migration file with
// the new DDL applies just what is new (`idem inbox ddl --from-version N`
// renders only the newer migrations). Partitions (partitioned layout) are
// not in it: create them with [Store.EnsurePartitions] or `idem inbox
// partitions ensure`, then daily.
func DDL(table string, layout Layout, window time.Duration) (string, error) {
	sc, err := script(table, layout, window)
	if err != nil {
		return "", err
	}
	return sc.UpSQL(), nil
}

// DownDDL returns the SQL that removes what [DDL] created: the table (and
// its partitions) and its rows in the bookkeeping tables, which are
// dropped too when no other inbox of the schema is recorded in them.
func DownDDL(table string, layout Layout) (string, error) {
	sc, err := script(table, layout, 0)
	if err != nil {
		return "", err
	}
	return sc.DownSQL(), nil
}

func script(table string, layout Layout, window time.Duration) (inboxdb.Script, error) {
	if table == "" {
		table = "idem_inbox"
	}
	id, err := parseIdent(table)
	if err != nil {
		return inboxdb.Script{}, err
	}
	if layout != Plain && layout != Partitioned {
		return inboxdb.Script{}, fmt.Errorf("%w: pgxinbox: unknown layout %d", idem.ErrConfig, layout)
	}
	t := inboxdb.Table{Name: id[len(id)-1]}
	if len(id) == 2 {
		t.Schema = id[0]
	}
	sc, err := inboxdb.Postgres(t, layout).Script(window, 0)
	if err != nil {
		return sc, fmt.Errorf("pgxinbox: rendering the DDL of %s: %w", table, err)
	}
	return sc, nil
}

// Check verifies the inbox table ([idemstore.Store.Check]): it exists as a
// table of the configured layout, with the inbox's columns, its unique key
// on (consumer, key) (partitioned: and partition_time), its keep_until
// index (plain), its stored layout and a sane window, at this build's
// schema version (an older one needs Migrate; a newer one means this binary
// is older than the one that migrated it), and, partitioned, with
// partitions for today and tomorrow. Each problem comes with its fix. Two
// queries: the catalog, then the version and settings.
func (s *Store) Check(ctx context.Context) ([]idemstore.SchemaProblem, error) {
	probs, err := s.inbox.Check(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgxinbox: %w", err)
	}
	return probs, nil
}
