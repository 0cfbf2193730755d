// Package pgerr is the one place that reads PostgreSQL errors for idem's
// stores: which errors are worth another try, and which failed COMMITs leave
// the outcome unknown. Decisions go by SQLSTATE and the protocol's
// unlocalized severity, never by message text (a localized server would
// break text matching).
package pgerr

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idemstore"
)

// Classify: data exceptions (class 22), integrity violations (class 23,
// such as a business table's unique index) and program limits (class 54:
// an index row over its size limit, a statement too complex, too many
// columns or arguments) fail the same way every time.
// An undefined table (42P01), a missing privilege (42501), an unknown
// database (3D000) or failed authentication (class 28) is a configuration
// error: the schema or the role is not set up for the consumer (a deploy ran
// before its migration), which no message caused.
// A server that cannot be reached or is going away — no connection, class
// 08, 57P01–57P03 shutdowns and startups, 53300 too many connections — is
// unavailable, and so is a server that cannot write (25006
// read_only_sql_transaction): a hot standby, or a primary demoted or fenced
// read-only during a failover, which is where a session lands while the
// promotion has not happened yet. The claim, a transaction's first write,
// meets it before any handler runs; a handler that makes its transaction
// read-only and then writes is held the same way, which fits a consumer
// that cannot work on any message.
// Serialization failures (40001), deadlocks (40P01) and lock timeouts
// (55P03) are contention with another transaction: busy. Everything else —
// a handler's own error included — may succeed on another try.
func Classify(err error) idemstore.ErrorClass {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) != 5:
			return idemstore.ClassTransient
		case pgErr.Code[:2] == "22", pgErr.Code[:2] == "23", pgErr.Code[:2] == "54":
			return idemstore.ClassPermanent
		case pgErr.Code == "42P01", pgErr.Code == "42501", pgErr.Code == "3D000", pgErr.Code[:2] == "28":
			return idemstore.ClassConfig
		case pgErr.Code == "40001", pgErr.Code == "40P01", pgErr.Code == "55P03":
			// Contention with another transaction, not the message's
			// doing.
			return idemstore.ClassBusy
		case pgErr.Code == "25P03", pgErr.Code == "57014":
			// The server ended a transaction that idled or ran too long:
			// the handler's slowness, not an outage, though the session
			// may end with it.
			return idemstore.ClassTransient
		case sessionEnding(pgErr), pgErr.Code == "53300", ReadOnly(pgErr):
			return idemstore.ClassUnavailable
		}
		return idemstore.ClassTransient
	}
	if connectionLost(err) {
		return idemstore.ClassUnavailable
	}
	return idemstore.ClassTransient
}

// connectionLost reports whether err is the driver or the network saying
// the connection could not be made or broke, by error type.
func connectionLost(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
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

// ReadOnly reports whether err is the server refusing a write because it
// cannot write now (25006): a hot standby, or a server fenced with
// default_transaction_read_only. The session is of no use to a writer: a
// store drops it, so its pool dials again and target_session_attrs=read-write
// finds the primary.
func ReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
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
