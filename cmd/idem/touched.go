package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"sync"

	"github.com/idemkit/idem/sqliteinbox"
)

// databaseNote collects each database a command opened, once, with any
// password redacted, so that the command names on stderr, when it ends
// with its report (without an error, or with findings), which databases
// it touched. A failed command's error line stays the one line it is.
type databaseNote struct {
	mu    sync.Mutex
	w     io.Writer
	cmd   string
	seen  map[string]bool
	order []string
}

type databaseNoteKey struct{}

// withDatabaseNote returns ctx on which noteDatabase collects the
// databases opened, and the note that prints them.
func withDatabaseNote(ctx context.Context, w io.Writer, cmd string) (context.Context, *databaseNote) {
	n := &databaseNote{w: w, cmd: cmd, seen: map[string]bool{}}
	return context.WithValue(ctx, databaseNoteKey{}, n), n
}

// print writes "idem <cmd>: database: <where>" for each database noted, in
// the order they were opened.
func (n *databaseNote) print() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, where := range n.order {
		fmt.Fprintf(n.w, "idem %s: database: %s\n", n.cmd, where)
	}
}

// noteDatabase says that the command opened the database at where
// (redacted), once per database; without a note on ctx it says nothing.
func noteDatabase(ctx context.Context, where string) {
	n, ok := ctx.Value(databaseNoteKey{}).(*databaseNote)
	if !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seen[where] {
		return
	}
	n.seen[where] = true
	n.order = append(n.order, where)
}

// openSQLite opens the SQLite database file path and notes it.
func openSQLite(ctx context.Context, path string) (*sql.DB, error) {
	db, err := sqliteinbox.Open(path)
	if err == nil {
		noteDatabase(ctx, "SQLite "+path)
	}
	return db, err
}
