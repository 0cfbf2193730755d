package idemmigrate

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/internal/migrator"
)

// Block is one statement of a [Script].
type Block struct {
	SQL string
	// Compound marks a statement with semicolons inside (a PL/pgSQL
	// block), which some tools must be told not to split (goose's
	// StatementBegin/End).
	Compound bool
}

// Script is the SQL Migrate runs on a new database, for a migration tool to
// run instead: every selected component's tables, its settings, and its
// version in idem_migrations, so that consumers and a later Migrate find
// them up to date. It is rendered from the same migration files Migrate
// applies.
type Script struct {
	Engine     Engine
	Components []string
	// Up creates; Down removes what Up created.
	Up, Down []Block
}

// NewScript renders the script of the components cfg selects on e.
func NewScript(e Engine, cfg *Config) (Script, error) {
	m, err := newMigrator(e, cfg)
	if err != nil {
		return Script{}, err
	}
	comps, err := m.components()
	if err != nil {
		return Script{}, err
	}
	s := Script{Engine: e, Components: m.Components()}
	var downs [][]Block
	for _, c := range comps {
		var up, down []Block
		if c.Name == Inbox {
			// The inbox's own script: on PostgreSQL safe to run again.
			d, err := m.inboxDialect()
			if err != nil {
				return s, err
			}
			sc, err := d.Script(m.window(), 0)
			if err != nil {
				return s, err
			}
			up, down = blocks(sc.Up), blocks(sc.Down)
		} else {
			up, down, err = record(e, c)
			if err != nil {
				return s, fmt.Errorf("rendering %s table %s: %w", c.Name, c.Table, err)
			}
		}
		if len(up) > 0 {
			up[0].SQL = "-- " + c.Name + " " + c.Table + ", schema version " + strconv.Itoa(len(c.Migrations)) + "\n" + up[0].SQL
		}
		s.Up = append(s.Up, up...)
		downs = append(downs, down)
	}
	// Down removes the components in the reverse order.
	for i := len(downs) - 1; i >= 0; i-- {
		s.Down = append(s.Down, downs[i]...)
	}
	return s, nil
}

func blocks(bs []inboxdb.Block) []Block {
	out := make([]Block, len(bs))
	for i, b := range bs {
		out[i] = Block{SQL: b.SQL, Compound: b.Compound}
	}
	return out
}

// record renders what the migrator runs for a new table of c: it runs the
// component against a recorder that keeps each statement with its
// arguments written in, and finds nothing recorded before.
func record(e Engine, c *migrator.Component) (up, down []Block, err error) {
	r := &recorder{engine: e}
	ctx := context.Background()
	r.add(migrator.VersionTableDDL(migrator.Engine(e), c.Book))
	if c.Setup != nil {
		if err := c.Setup(ctx, r); err != nil {
			return nil, nil, err
		}
	}
	for _, m := range c.Migrations {
		for _, stmt := range m.Statements {
			r.add("-- " + m.Name + "\n" + stmt)
		}
	}
	if _, err := r.Exec(ctx, migrator.WriteVersionSQL(migrator.Engine(e), c.Book), c.Key, len(c.Migrations)); err != nil {
		return nil, nil, err
	}
	if c.After != nil {
		if err := c.After(ctx, r, 0, len(c.Migrations)); err != nil {
			return nil, nil, err
		}
	}
	for _, d := range c.Drop {
		down = append(down, Block{SQL: d})
	}
	down = append(down, Block{SQL: `DELETE FROM ` + c.Book + ` WHERE table_name = ` + literal(e, c.Key)})
	return r.blocks, down, r.err
}

// recorder is a [migrator.Conn] that keeps what it is sent and answers that
// nothing is there.
type recorder struct {
	engine Engine
	blocks []Block
	err    error
}

func (r *recorder) add(stmt string) { r.blocks = append(r.blocks, Block{SQL: stmt}) }

var (
	dollarParam  = regexp.MustCompile(`\$(\d+)`)
	numberedMark = regexp.MustCompile(`\?(\d+)`)
)

func (r *recorder) Exec(_ context.Context, stmt string, args ...any) (int64, error) {
	lit := func(n string) string {
		i, _ := strconv.Atoi(n)
		if i < 1 || i > len(args) {
			r.err = fmt.Errorf("statement %q: no argument %s", stmt, n)
			return n
		}
		return literal(r.engine, args[i-1])
	}
	switch {
	case len(args) == 0:
	case r.engine == Postgres:
		stmt = dollarParam.ReplaceAllStringFunc(stmt, func(m string) string { return lit(m[1:]) })
	case numberedMark.MatchString(stmt):
		stmt = numberedMark.ReplaceAllStringFunc(stmt, func(m string) string { return lit(m[1:]) })
	default:
		n := 0
		var b strings.Builder
		for _, ch := range stmt {
			if ch == '?' {
				n++
				b.WriteString(lit(strconv.Itoa(n)))
				continue
			}
			b.WriteRune(ch)
		}
		stmt = b.String()
	}
	r.add(stmt)
	return 1, nil
}

func (r *recorder) QueryRow(context.Context, string, ...any) migrator.Row { return noRow{} }

func (r *recorder) Query(context.Context, string, func(migrator.Row) error, ...any) error {
	return nil
}

type noRow struct{}

func (noRow) Scan(...any) error { return sql.ErrNoRows }

// literal writes v as an SQL literal of e.
func literal(e Engine, v any) string {
	switch v := v.(type) {
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case time.Time:
		if e == Postgres {
			return "'" + v.UTC().Format(time.RFC3339Nano) + "'::timestamptz"
		}
		return "'" + v.UTC().Format(inboxdb.SQLiteTimeFormat) + "'"
	}
	return fmt.Sprintf("'%v'", v)
}

// Text renders blocks as one script, each statement ending in a semicolon;
// annotate wraps compound ones as goose wants.
func Text(bs []Block, annotate bool) string {
	in := make([]inboxdb.Block, len(bs))
	for i, b := range bs {
		in[i] = inboxdb.Block{SQL: b.SQL, Compound: b.Compound}
	}
	return inboxdb.Text(in, annotate)
}

// UpSQL is the whole up script, with a header.
func (s Script) UpSQL() string {
	return fmt.Sprintf("-- idem tables on %s: %s.\n-- Apply it once to a new database (migration tools do), or run idem migrate instead.\n\n",
		s.Engine, strings.Join(s.Components, ", ")) + Text(s.Up, false)
}

// DownSQL is the whole down script.
func (s Script) DownSQL() string {
	return fmt.Sprintf("-- Removes the idem tables on %s: %s.\n\n", s.Engine, strings.Join(s.Components, ", ")) + Text(s.Down, false)
}
