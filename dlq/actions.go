package dlq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// ActionsTable is the audit table of the actions taken on dead letters from
// a program other than the command line (the web console): who redrove or
// purged what, when and with which result, in the inbox table's schema,
// beside the audit table of retired markers.
const ActionsTable = "idem_dlq_actions"

// Acted is one row of the actions table.
type Acted struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	By      string    `json:"by"`
	Why     string    `json:"why,omitempty"`
	Op      string    `json:"op"`
	DLQ     string    `json:"dlq"`
	Matched int       `json:"matched"`
	Done    int       `json:"done"`
	Refused int       `json:"refused"`
	// IDs are the message IDs that left the DLQ.
	IDs []string `json:"ids"`
	// Error is the error that stopped the action, if any.
	Error string `json:"error,omitempty"`
	// Origin says where the action came from ("console 127.0.0.1:51234").
	Origin string `json:"origin,omitempty"`
}

// actionsDDL creates the actions table. Rows are only ever inserted.
func actionsDDL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    by       text NOT NULL CHECK (by <> ''),
    why      text NOT NULL,
    op       text NOT NULL,
    dlq      text NOT NULL,
    matched  integer NOT NULL,
    done     integer NOT NULL,
    refused  integer NOT NULL,
    ids      text[] NOT NULL,
    error    text NOT NULL,
    origin   text NOT NULL,
    inbox_table text NOT NULL
)`
}

// actionsTable is the quoted actions table beside the inbox table.
func (in *Inbox) actionsTable() string {
	id := pgx.Identifier{ActionsTable}
	if schema, _, ok := strings.Cut(in.cfg.Table, "."); ok {
		id = pgx.Identifier{schema, ActionsTable}
	}
	return id.Sanitize()
}

// ensureActions creates the actions table when it does not exist.
func (in *Inbox) ensureActions(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.actions {
		return nil
	}
	if _, err := in.db.Exec(ctx, actionsDDL(in.actionsTable())); err != nil {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "23505" && pe.Code != "42P07") {
			return fmt.Errorf("creating the actions table %s: %w", in.actionsTable(), err)
		}
	}
	in.actions = true
	return nil
}

// ActionsDDL is the statement that creates the actions table beside the
// inbox table, for a team that applies its schema with a migration tool.
// The first recorded action creates it otherwise.
func ActionsDDL(inboxTable string) (string, error) {
	// The key function is required by NewInbox and plays no part here.
	in, err := NewInbox(noDB{}, &InboxConfig{Table: inboxTable, Key: idem.ByMessageID})
	if err != nil {
		return "", err
	}
	return actionsDDL(in.actionsTable()) + ";\n", nil
}

// Record keeps an action taken on a DLQ, with its result, in the actions
// table: res is what [Redrive] or [Purge] returned, runErr the error that
// stopped it (nil when none). By is required.
func (in *Inbox) Record(ctx context.Context, by, why, origin, op string, res Result, runErr error) (Acted, error) {
	if strings.TrimSpace(by) == "" {
		return Acted{}, errors.New("recording an action needs who")
	}
	if err := in.ensureActions(ctx); err != nil {
		return Acted{}, err
	}
	a := Acted{By: by, Why: why, Op: op, DLQ: res.DLQ, Matched: res.Matched, Done: res.Done, Refused: res.Refused, IDs: []string{}, Origin: origin}
	for _, it := range res.Items {
		if it.Done {
			a.IDs = append(a.IDs, it.ID)
		}
	}
	if runErr != nil {
		a.Error = runErr.Error()
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return Acted{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	err = tx.QueryRow(ctx, `INSERT INTO `+in.actionsTable()+` (by, why, op, dlq, matched, done, refused, ids, error, origin, inbox_table)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id, at`,
		a.By, a.Why, a.Op, a.DLQ, a.Matched, a.Done, a.Refused, a.IDs, a.Error, a.Origin, in.cfg.Table).Scan(&a.ID, &a.At)
	if err != nil {
		return Acted{}, fmt.Errorf("recording the %s of %s: %w", op, res.DLQ, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Acted{}, fmt.Errorf("recording the %s of %s: %w", op, res.DLQ, err)
	}
	return a, nil
}

// Actions lists the recorded actions of this inbox, newest first, at most
// limit (0: 100); none when the table does not exist yet (reading creates
// nothing).
func (in *Inbox) Actions(ctx context.Context, limit int) ([]Acted, error) {
	if limit <= 0 {
		limit = 100
	}
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `SELECT id, at, by, why, op, dlq, matched, done, refused, ids, error, origin
FROM `+in.actionsTable()+` WHERE inbox_table = $1 ORDER BY id DESC LIMIT $2`, in.cfg.Table, limit)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return []Acted{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the actions in %s: %w", in.actionsTable(), err)
	}
	out := []Acted{}
	var a Acted
	_, err = pgx.ForEachRow(rows, []any{&a.ID, &a.At, &a.By, &a.Why, &a.Op, &a.DLQ, &a.Matched, &a.Done, &a.Refused, &a.IDs, &a.Error, &a.Origin}, func() error {
		out = append(out, a)
		a.IDs = nil
		return nil
	})
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return []Acted{}, nil
	}
	return out, err
}
