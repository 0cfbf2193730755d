// Package pgerr is the one place that reads PostgreSQL errors for idem's
// stores: which errors are worth another try, and which failed COMMITs leave
// the outcome unknown. Decisions go by SQLSTATE and the protocol's
// unlocalized severity, never by message text (a localized server would
// break text matching).
package pgerr

import (
	"database/sql"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// Classify: data exceptions (class 22) and integrity violations (class 23,
// such as a business table's unique index) fail the same way every time;
// everything else — 40001 serialization, 40P01 deadlock, 55P03 lock timeout,
// 57P01 admin shutdown, class 08 connection errors, a lost connection, a
// handler's own error — may succeed on another try.
func Classify(err error) idem.ErrorClass {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "22", "23":
			return idem.ClassPermanent
		}
	}
	return idem.ClassTransient
}

// CommitUnknown reports whether a failed COMMIT may nevertheless have
// committed. An ERROR answer means the server rolled back (a deferred
// constraint failed, say): the outcome is known. A FATAL or PANIC answer
// means the server is dropping the session, which it may do after the commit
// is durable (a backend terminated while waiting for a synchronous standby
// has committed locally). No answer at all means the connection broke.
func CommitUnknown(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return sessionEnding(pgErr)
	}
	// The server answered ROLLBACK to COMMIT (the transaction had failed),
	// or database/sql refused before anything reached the server.
	if errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, sql.ErrTxDone) {
		return false
	}
	return true
}

func sessionEnding(e *pgconn.PgError) bool {
	switch e.SeverityUnlocalized {
	case "FATAL", "PANIC":
		return true
	}
	switch {
	case strings.HasPrefix(e.Code, "08"): // connection exception
		return true
	case e.Code == "57P01", e.Code == "57P02", e.Code == "57P03": // admin/crash shutdown, cannot connect now
		return true
	}
	return false
}
