package sqlinbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
)

// MySQL is the MySQL dialect (InnoDB), for a *sql.DB opened with
// github.com/go-sql-driver/mysql, best through mysqlinbox (a package of its
// own, so that other users of sqlinbox do not link the driver): the session
// needs sql_mode ANSI_QUOTES, parseTime and a UTC loc. Its claim is two
// statements per batch (MySQL's INSERT has no RETURNING) after a SET of the
// session's lock wait timeout. A prune batch selects the oldest keys past
// the cut-off FOR UPDATE and deletes them in one transaction at READ
// COMMITTED, which locks no gap a claim inserts into (MySQL has no
// DELETE ... RETURNING). Migrators are serialized by a named lock
// (GET_LOCK), held by the migrating session across the implicit commits of
// its DDL. Every statement is MySQL 8.0's syntax, which MariaDB also
// accepts.
var MySQL Dialect = mysqlDialect{}

// MariaDB is [MySQL] for MariaDB (10.5 and later), which claims in one
// statement per batch: SET STATEMENT bounds the INSERT's lock wait, and
// INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING returns every row of the
// batch with its claim token after the statement, ours only where it
// inserted; a prune batch is one DELETE ... ORDER BY keep_until LIMIT ...
// RETURNING, in a transaction of its own at READ COMMITTED. mysqlinbox.New
// picks it when the server says it is MariaDB.
var MariaDB Dialect = mysqlDialect{mariadb: true}

type mysqlDialect struct{ mariadb bool }

func (d mysqlDialect) Name() string {
	if d.mariadb {
		return "mariadb"
	}
	return "mysql"
}
func (d mysqlDialect) String() string { return d.Name() }

// maxParams is the protocol's limit on a prepared statement's placeholders.
func (mysqlDialect) maxParams() int                     { return 65535 }
func (mysqlDialect) schemas() bool                      { return false }
func (m mysqlDialect) driver(db *sql.DB) inboxdb.Driver { return newMySQLDriver(db, m.mariadb) }

// statements is inboxdb's MySQL SQL; on MySQL (not MariaDB) the prune batch
// is the SELECT ... FOR UPDATE that [mysqlBatchTx] runs with its DELETE,
// since MySQL has no DELETE ... RETURNING.
func (m mysqlDialect) statements(t inboxdb.Table) *inboxdb.Dialect {
	d := inboxdb.MySQL(t)
	if !m.mariadb {
		d.PruneBatch = mysqlPruneBatch(t)
	}
	return d
}

// lockWaitSeconds is d as innodb_lock_wait_timeout takes it: MySQL and
// MariaDB accept whole seconds only (a fraction is refused, error 1232), so
// the wait is d rounded up to the next second, at least 1 s.
func lockWaitSeconds(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10)
}

// setLockTimeout sets innodb_lock_wait_timeout (see lockWaitSeconds).
// MySQL has no transaction-scoped setting, so the value stays with the
// session for its later transactions until a claim with a lock timeout sets
// it again. (MariaDB's claim bounds its own INSERT instead.)
func (mysqlDialect) setLockTimeout(ctx context.Context, tx *sql.Tx, d time.Duration) error {
	_, err := tx.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = "+lockWaitSeconds(d))
	return err
}

// claim claims in chunks of the parameter limit.
func (m mysqlDialect) claim(ctx context.Context, tx *sql.Tx, d *inboxdb.Dialect, consumer string, claims []idemstore.Claim, lockTimeout time.Duration, inserted []bool) error {
	if lockTimeout > 0 && !m.mariadb {
		if err := m.setLockTimeout(ctx, tx, lockTimeout); err != nil {
			return fmt.Errorf("setting lock timeout: %w", err)
		}
	}
	chunk := m.maxParams() / d.Claim.RowParams
	for start := 0; start < len(claims); start += chunk {
		end := min(start+chunk, len(claims))
		if err := m.claimChunk(ctx, tx, d, consumer, claims[start:end], lockTimeout, inserted[start:end]); err != nil {
			return err
		}
	}
	return nil
}

// claimChunk is the MySQL claim (see inboxdb.MySQL): an INSERT ... ON
// DUPLICATE KEY UPDATE that stamps the rows it inserts with a random token
// of this claim, then a SELECT of the batch's keys that carry the token.
// The claims arrive sorted by key (the processor sorts them), so two
// overlapping batches lock their rows in one order; a deadlock InnoDB still
// detects (gap locks of inserts into one range) is classified busy and
// retried, never taken for a duplicate.
func (m mysqlDialect) claimChunk(ctx context.Context, tx *sql.Tx, d *inboxdb.Dialect, consumer string, claims []idemstore.Claim, lockTimeout time.Duration, inserted []bool) error {
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return fmt.Errorf("making a claim token: %w", err)
	}
	args := make([]any, 0, len(claims)*d.Claim.RowParams)
	for _, c := range claims {
		var et any
		if !c.EventTime.IsZero() {
			et = d.TimeArg(c.EventTime)
		}
		args = append(args, []byte(consumer), []byte(c.Key), []byte(c.MessageID), body(c), et, et, token)
	}
	var rows *sql.Rows
	var err error
	if m.mariadb {
		q := d.Claim.Build(len(claims)) + ` RETURNING "key", claim_token`
		if lockTimeout > 0 {
			q = "SET STATEMENT innodb_lock_wait_timeout = " + lockWaitSeconds(lockTimeout) + " FOR " + q
		}
		rows, err = tx.QueryContext(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("inserting inbox markers: %w", err)
		}
	} else {
		if _, err := tx.ExecContext(ctx, d.Claim.Build(len(claims)), args...); err != nil {
			return fmt.Errorf("inserting inbox markers: %w", err)
		}
		sel := inboxdb.MySQLClaimed(d.Table)
		args = append(args[:0], []byte(consumer), token)
		for _, c := range claims {
			args = append(args, []byte(c.Key))
		}
		rows, err = tx.QueryContext(ctx, sel.Build(len(claims)), args...)
		if err != nil {
			return fmt.Errorf("reading inserted keys: %w", err)
		}
	}
	defer rows.Close()
	fresh := make(map[string]bool, len(claims))
	for rows.Next() {
		var k, tok []byte
		if err := rows.Scan(&k, &tok); err != nil {
			return fmt.Errorf("reading inserted keys: %w", err)
		}
		if bytes.Equal(tok, token) {
			fresh[string(k)] = true
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading inserted keys: %w", err)
	}
	// A key repeated in the claims was inserted at most once, by its first
	// occurrence.
	for i, c := range claims {
		if fresh[c.Key] {
			inserted[i] = true
			delete(fresh, c.Key)
		}
	}
	return nil
}

// buildExtend glues the Extend statement, whose rows a UNION ALL joins.
func (mysqlDialect) buildExtend(d *inboxdb.Dialect, n int) string { return inboxdb.MySQLExtend(d, n) }

// MySQL error numbers idem tells apart.
const (
	mysqlDupEntry          = 1062
	mysqlNoSuchTable       = 1146
	mysqlAccessDenied      = 1045
	mysqlDBAccessDenied    = 1044
	mysqlTableAccessDenied = 1142
	mysqlBadDB             = 1049
	mysqlLockWaitTimeout   = 1205
	mysqlDeadlock          = 1213
	mysqlTooManyConns      = 1040
	mysqlServerShutdown    = 1053
	mysqlDataTooLong       = 1406
	mysqlBadNull           = 1048
	mysqlTruncated         = 1292
	mysqlTruncatedWrong    = 1366
	mysqlNoReferenced      = 1452
	mysqlRowIsReferenced   = 1451
	mysqlCheckViolated     = 4025 // MariaDB; MySQL's is 3819
	mysqlCheckViolatedMy   = 3819
	mysqlOutOfRange        = 1264
	mysqlDivisionByZero    = 1365
	mysqlKeyTooLong        = 1071
	mysqlRowTooLarge       = 1118 // a row over the table type's limit
	mysqlRowTooLargeInnoDB = 139  // InnoDB's own, at an INSERT
	mysqlPacketTooLarge    = 1153 // a statement over max_allowed_packet
	mysqlGoneAway          = 2006
	mysqlLostConnection    = 2013
	mysqlOptionPrevents    = 1290 // --read-only, super_read_only (and other options)
	mysqlReadOnlyMode      = 1836 // MySQL's read-only mode
	mysqlReadOnlyTx        = 1792 // a write in a READ ONLY transaction
)

// mysqlNumber finds a server error's number in err's chain: the driver's
// *MySQLError, found by its shape (a struct with a Number uint16 field) so
// that sqlinbox does not link the driver.
func mysqlNumber(err error) (uint16, bool) {
	for _, e := range chain(err) {
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct || v.Type().Name() != "MySQLError" {
			continue
		}
		if f := v.FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
			return uint16(f.Uint()), true
		}
	}
	return 0, false
}

// chain is err and every error it wraps, depth first.
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

// mysqlConnectionLost reports whether err says the connection could not be
// made or broke: the network's errors, driver.ErrBadConn, and the driver's
// "invalid connection" (its ErrInvalidConn, returned when a connection
// breaks mid-statement).
func mysqlConnectionLost(err error) bool {
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	for _, e := range chain(err) {
		if e.Error() == "invalid connection" {
			return true
		}
	}
	return false
}

// commitUnknown: a COMMIT the server answered with an error was rolled
// back; one that got no answer (the connection broke: 2006, 2013, a network
// error, an invalid connection) may have committed.
func (mysqlDialect) commitUnknown(err error) bool {
	if n, ok := mysqlNumber(err); ok {
		return n == mysqlGoneAway || n == mysqlLostConnection
	}
	return mysqlConnectionLost(err)
}

// classify: deadlocks (1213) and lock wait timeouts (1205) are contention,
// busy; a gone or lost server (2006, 2013, network errors), too many
// connections (1040) or a shutdown (1053) is unavailable, and so is a
// server that cannot write (1290 under read_only or super_read_only, 1836,
// 1792): how a failover fences the old primary, an outage rather than the
// message's fault. Such a connection would fail again on the same server;
// the driver's rejectReadOnly (which mysqlinbox.Open sets) closes it and
// answers driver.ErrBadConn instead, so that the next try dials again
// (where a proxy or a DNS name may lead to the new primary). A missing table,
// database or privilege is a configuration error; data and integrity errors
// (a duplicate entry, 1062, where one is not expected: a handler's own
// unique key; a value out of range, 1264) and the server's limits (a key
// or row too long, 1071, 1118, 139; a statement over max_allowed_packet,
// 1153) fail the same way every time. Everything else is transient.
func (mysqlDialect) classify(err error) idemstore.ErrorClass {
	if n, ok := mysqlNumber(err); ok {
		switch n {
		case mysqlDeadlock, mysqlLockWaitTimeout:
			return idemstore.ClassBusy
		case mysqlGoneAway, mysqlLostConnection, mysqlTooManyConns, mysqlServerShutdown,
			mysqlOptionPrevents, mysqlReadOnlyMode, mysqlReadOnlyTx:
			return idemstore.ClassUnavailable
		case mysqlNoSuchTable, mysqlBadDB, mysqlAccessDenied, mysqlDBAccessDenied, mysqlTableAccessDenied:
			return idemstore.ClassConfig
		case mysqlDupEntry, mysqlDataTooLong, mysqlBadNull, mysqlTruncated, mysqlTruncatedWrong,
			mysqlNoReferenced, mysqlRowIsReferenced, mysqlCheckViolated, mysqlCheckViolatedMy,
			mysqlOutOfRange, mysqlDivisionByZero:
			return idemstore.ClassPermanent
		case mysqlKeyTooLong, mysqlRowTooLarge, mysqlRowTooLargeInnoDB, mysqlPacketTooLarge:
			// Limits of the server, like PostgreSQL's class 54: the same
			// value fails the same way on every try.
			return idemstore.ClassPermanent
		}
		return idemstore.ClassTransient
	}
	if mysqlConnectionLost(err) {
		return idemstore.ClassUnavailable
	}
	return idemstore.ClassTransient
}

// durability reads what inboxdb.MySQLDurability takes: the replicas from
// performance_schema.processlist where it is on (MySQL 8.0.22 and later),
// else from information_schema.PROCESSLIST, and as unknown without the
// PROCESS privilege.
func (m mysqlDialect) durability(ctx context.Context, db *sql.DB) (idemstore.Durability, error) {
	var flushLog, syncBinlog string
	var logBin, perfSchema, process bool
	if err := db.QueryRowContext(ctx, inboxdb.MySQLDurabilitySQL).Scan(&flushLog, &syncBinlog, &logBin, &perfSchema, &process); err != nil {
		return idemstore.Durability{}, err
	}
	replicas := inboxdb.MySQLUnknownReplicas
	if process {
		err := sql.ErrNoRows
		if perfSchema && !m.mariadb {
			err = db.QueryRowContext(ctx, inboxdb.MySQLReplicasSQL).Scan(&replicas)
		}
		if err != nil {
			// Before 8.0.22 there is no performance_schema.processlist.
			if err := db.QueryRowContext(ctx, inboxdb.MySQLReplicasFallbackSQL).Scan(&replicas); err != nil {
				return idemstore.Durability{}, err
			}
		}
	}
	semiSync := map[string]string{}
	for _, q := range []string{inboxdb.MySQLSemiSyncSQL, inboxdb.MySQLSemiSyncStatusSQL} {
		if err := showInto(ctx, db, q, semiSync); err != nil {
			return idemstore.Durability{}, err
		}
	}
	return inboxdb.MySQLDurability(m.mariadb, flushLog, syncBinlog, logBin, replicas, semiSync), nil
}

// showInto adds the rows of a SHOW ... VARIABLES or STATUS to into, by
// lower-case name.
func showInto(ctx context.Context, db *sql.DB, query string, into map[string]string) error {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return err
		}
		into[strings.ToLower(name)] = value
	}
	return rows.Err()
}

// brokenProbe bounds the question [Store.Broken] asks the server.
const brokenProbe = time.Second

// Broken implements idemstore.Store.Broken on MySQL and MariaDB (other
// dialects: it reports false). After a handler's failure the processor asks
// whether the transaction's connection is gone, or its server cannot write
// (read_only, how a failover fences the old primary): then the failure is an
// outage, held without spending the message's attempts, as a claim's would
// be. A natural consumer has no claim to meet the refusal first. The
// connection is gone when the driver closed it (rejectReadOnly, which
// mysqlinbox.Open sets, closes one the server refused a write on) or the
// server does not answer; a server that answers read_only = 1 cannot take the
// handler's writes either. A handler's own failure on a live, writable
// connection is the message's.
func (s *Store) Broken(tx *sql.Tx) bool {
	if _, ok := s.dialect.(mysqlDialect); !ok || tx == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), brokenProbe)
	defer cancel()
	var readOnly bool
	if err := tx.QueryRowContext(ctx, "SELECT @@GLOBAL.read_only").Scan(&readOnly); err != nil {
		return mysqlConnectionLost(err) || errors.Is(err, sql.ErrTxDone) || errors.Is(err, context.DeadlineExceeded)
	}
	return readOnly
}
