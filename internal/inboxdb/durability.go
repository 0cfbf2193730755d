package inboxdb

import (
	"fmt"
	"strconv"

	"github.com/idemkit/idem/idemstore"
)

// The durability checks of each database ([idemstore.Store.Durability]): the
// settings that decide whether a commit the server acknowledged survives a
// crash or a failover, read by the stores, and the risks they carry.

// PostgresDurabilitySQL reads, as the session sees them, what
// [PostgresDurability] takes.
const PostgresDurabilitySQL = `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
	current_setting('fsync'), pg_is_in_recovery(),
	(SELECT count(*) FROM pg_stat_replication r WHERE ` + physicalStandby + `),
	(SELECT CASE WHEN bool_or(r.sync_state IS NULL) THEN -1 ELSE count(*) FILTER (WHERE r.sync_state IN ('sync', 'quorum')) END
	 FROM pg_stat_replication r WHERE ` + physicalStandby + `)`

// physicalStandby keeps, of pg_stat_replication's walsenders, those that
// stream to a standby: not a base backup's, not a logical replication
// slot's (a change-data-capture reader or a subscription, which no
// failover promotes).
const physicalStandby = `r.state IS DISTINCT FROM 'backup'
	AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.slot_type = 'logical' AND s.active_pid = r.pid)`

// PostgresDurability turns PostgreSQL's settings into risks:
//
//   - fsync off, or synchronous_commit off: a crash of the server alone
//     loses commits it acknowledged;
//   - streaming standbys with no synchronous_standby_names: replication is
//     asynchronous, and a failover to a standby that had not received the
//     last commits loses them;
//   - synchronous_standby_names set with synchronous_commit local: commits
//     are acknowledged before the standby has them, the same hazard.
//
// synchronous_commit on (the standby flushed the commit) or remote_apply
// (it also applied it) with a synchronous standby keeps every acknowledged
// commit across a failover to that standby; remote_write keeps it unless
// the standby's operating system crashes at the same time as the primary.
// A standby disconnected while the settings are read is not counted, nor
// a base backup's or a logical replication slot's walsender.
func PostgresDurability(syncCommit, standbyNames, fsync string, recovery bool, standbys, syncStandbys int) idemstore.Durability {
	d := idemstore.Durability{Settings: map[string]string{
		"synchronous_commit":        syncCommit,
		"synchronous_standby_names": strconv.Quote(standbyNames),
		"fsync":                     fsync,
		"in_recovery":               strconv.FormatBool(recovery),
		"streaming_standbys":        strconv.Itoa(standbys),
		"synchronous_standbys":      strconv.Itoa(syncStandbys),
	}}
	if syncStandbys < 0 {
		// pg_stat_replication shows sync_state only to roles with
		// pg_read_all_stats.
		d.Settings["synchronous_standbys"] = "unknown (needs pg_read_all_stats)"
	}
	if fsync == "off" {
		d.Risks = append(d.Risks, risk("fsync is off: a crash of the server can lose commits it acknowledged, whose messages idem has acked",
			"set fsync = on in postgresql.conf"))
	}
	switch {
	case syncCommit == "off":
		d.Risks = append(d.Risks, risk("synchronous_commit is off: the server acknowledges a commit before its WAL is flushed, so a crash loses the last acknowledged effects while their messages stay acked",
			"ALTER ROLE <consumer role> SET synchronous_commit = on (or remove the override from the connection URL)"))
	case standbyNames == "" && standbys > 0:
		d.Risks = append(d.Risks, risk(fmt.Sprintf("%d streaming standby(s) replicate asynchronously (synchronous_standby_names is empty): a failover to a standby that had not received the last commits loses their effects while their messages stay acked", standbys),
			"set synchronous_standby_names to the standbys' application_name (e.g. 'ANY 1 (replica1, replica2)') and synchronous_commit = on; see docs/clusters.md"))
	case standbyNames != "" && syncCommit == "local":
		d.Risks = append(d.Risks, risk("synchronous_commit is local: commits are acknowledged before the synchronous standby has them, so a failover can lose acknowledged effects",
			"ALTER ROLE <consumer role> SET synchronous_commit = on"))
	}
	return d
}

// MySQLDurabilitySQL reads the server-wide settings [MySQLDurability]
// takes, whether performance_schema is on, and whether the session's user
// holds the PROCESS privilege, without which the processlist shows the
// session's own threads only and the replicas cannot be counted. (A
// PROCESS granted through a role is not seen: the replicas then read as
// unknown.)
const MySQLDurabilitySQL = `SELECT @@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.sync_binlog, @@GLOBAL.log_bin, @@GLOBAL.performance_schema,
	EXISTS (SELECT 1 FROM information_schema.USER_PRIVILEGES WHERE PRIVILEGE_TYPE = 'PROCESS'
		AND GRANTEE = CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', SUBSTRING_INDEX(CURRENT_USER(), '@', -1), ''''))`

// MySQLReplicasSQL counts the replicas connected (their binlog dump
// threads) in performance_schema.processlist, MySQL 8.0.22 and later's
// (which deprecates information_schema.PROCESSLIST), when
// performance_schema is on; [MySQLReplicasFallbackSQL] elsewhere (MariaDB,
// older MySQL).
const MySQLReplicasSQL = `SELECT COUNT(*) FROM performance_schema.processlist WHERE COMMAND IN ('Binlog Dump', 'Binlog Dump GTID')`

// MySQLReplicasFallbackSQL is [MySQLReplicasSQL] on
// information_schema.PROCESSLIST.
const MySQLReplicasFallbackSQL = `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND IN ('Binlog Dump', 'Binlog Dump GTID')`

// MySQLSemiSyncSQL lists the semi-synchronous replication settings of
// the primary, named rpl_semi_sync_master_* (MariaDB, MySQL before 8.0.26)
// or rpl_semi_sync_source_* (MySQL 8.0.26 and later); none when the plugin
// is not loaded (MariaDB 10.3 and later has them built in).
const MySQLSemiSyncSQL = `SHOW GLOBAL VARIABLES WHERE Variable_name IN ('rpl_semi_sync_master_enabled', 'rpl_semi_sync_source_enabled',
	'rpl_semi_sync_master_timeout', 'rpl_semi_sync_source_timeout', 'rpl_semi_sync_master_wait_point', 'rpl_semi_sync_source_wait_point',
	'rpl_semi_sync_master_wait_no_slave', 'rpl_semi_sync_source_wait_no_replica',
	'rpl_semi_sync_master_wait_for_slave_count', 'rpl_semi_sync_source_wait_for_replica_count')`

// MySQLSemiSyncStatusSQL reads whether semi-synchronous replication is
// working now (Rpl_semi_sync_master_status; MySQL 8.0.26 and later's
// plugin: Rpl_semi_sync_source_status): OFF while enabled means the
// primary has fallen back to asynchronous replication. The caller passes
// them to [MySQLDurability] with the variables, by lower-case name.
const MySQLSemiSyncStatusSQL = `SHOW GLOBAL STATUS WHERE Variable_name IN ('Rpl_semi_sync_master_status', 'Rpl_semi_sync_source_status')`

// semiSyncFallback is the shortest rpl_semi_sync_*_timeout not reported:
// below it, a replica that stops acknowledging turns the primary
// asynchronous within a failover manager's usual detection time.
const semiSyncFallback = 60_000 // ms

// MySQLUnknownReplicas is the replicas count [MySQLDurability] takes when
// they could not be counted (the user lacks the PROCESS privilege).
const MySQLUnknownReplicas = -1

// MySQLDurability turns MySQL's and MariaDB's settings into risks
// (mariadb: the server is MariaDB; replicas: [MySQLUnknownReplicas] when
// not counted; semiSync: the variables of [MySQLSemiSyncSQL] and the
// status of [MySQLSemiSyncStatusSQL], by lower-case name):
//
//   - innodb_flush_log_at_trx_commit other than 1 (on MariaDB, 1 or 3,
//     which also flushes at every commit): commits are acknowledged before
//     InnoDB's log is flushed, and a crash loses the last ones;
//   - the binary log on with sync_binlog other than 1: a crash of the
//     operating system or a power loss (not of mysqld alone, whose writes
//     the operating system keeps) can lose commits from the binary log,
//     which replicas then never get;
//   - replicas connected without semi-synchronous replication: a failover
//     to a replica that had not received the last commits loses them;
//   - semi-synchronous replication waiting AFTER_COMMIT (MariaDB's
//     default) rather than AFTER_SYNC: other sessions see a commit before
//     any replica has it;
//   - semi-synchronous replication enabled whose status is OFF: the
//     primary has already fallen back to asynchronous replication;
//   - semi-synchronous replication that does not wait when no replica is
//     connected (wait_no_slave, wait_no_replica OFF), or whose timeout is
//     under a minute: when no replica acknowledges, the primary goes on
//     asynchronously, silently, and the same hazard returns.
func MySQLDurability(mariadb bool, flushLog, syncBinlog string, logBin bool, replicas int, semiSync map[string]string) idemstore.Durability {
	d := idemstore.Durability{Settings: map[string]string{
		"innodb_flush_log_at_trx_commit": flushLog,
		"sync_binlog":                    syncBinlog,
		"log_bin":                        strconv.FormatBool(logBin),
		"replicas":                       strconv.Itoa(replicas),
	}}
	if replicas < 0 {
		d.Settings["replicas"] = "unknown (no PROCESS privilege)"
	}
	for k, v := range semiSync {
		d.Settings[k] = v
	}
	if flushLog != "1" && (!mariadb || flushLog != "3") {
		d.Risks = append(d.Risks, risk("innodb_flush_log_at_trx_commit is "+flushLog+": the server acknowledges a commit before InnoDB's log is flushed, so a crash loses the last acknowledged effects while their messages stay acked",
			"SET PERSIST innodb_flush_log_at_trx_commit = 1 (MariaDB: SET GLOBAL, and in the server's configuration)"))
	}
	if logBin && syncBinlog != "1" {
		d.Risks = append(d.Risks, risk("sync_binlog is "+syncBinlog+": a crash of the operating system or a power loss (a crash of mysqld alone loses nothing) can lose acknowledged commits from the binary log, which replicas then never receive, so a failover loses them",
			"SET PERSIST sync_binlog = 1 (MariaDB: SET GLOBAL, and in the server's configuration)"))
	}
	// either is a setting by its MySQL 8.0.26 name, or else by its older
	// name (MariaDB's).
	either := func(source, master string) string {
		if v, ok := semiSync[source]; ok {
			return v
		}
		return semiSync[master]
	}
	enabled := either("rpl_semi_sync_source_enabled", "rpl_semi_sync_master_enabled") == "ON"
	switch {
	case replicas > 0 && !enabled:
		d.Risks = append(d.Risks, risk(fmt.Sprintf("%d replica(s) replicate asynchronously: a failover to a replica that had not received the last commits loses their effects while their messages stay acked", replicas),
			"enable semi-synchronous replication (rpl_semi_sync_source_enabled, MariaDB rpl_semi_sync_master_enabled, with wait point AFTER_SYNC) and a timeout longer than your failover's detection time; see docs/clusters.md"))
	case enabled:
		if wp := either("rpl_semi_sync_source_wait_point", "rpl_semi_sync_master_wait_point"); wp != "" && wp != "AFTER_SYNC" {
			d.Risks = append(d.Risks, risk("semi-synchronous replication waits "+wp+": a commit is visible to other sessions (a duplicate's claim, a reader of the effects) before any replica has it, so a failover at that moment loses a commit that others already acted on",
				"SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC (MySQL 8.0.26 and later: rpl_semi_sync_source_wait_point), and in the server's configuration"))
		}
		if st := either("rpl_semi_sync_source_status", "rpl_semi_sync_master_status"); st == "OFF" {
			d.Risks = append(d.Risks, risk("semi-synchronous replication is enabled but its status is OFF: no replica acknowledged in time and the primary has fallen back to asynchronous replication, so a failover now loses acknowledged effects",
				"bring a replica back to acknowledging (rpl_semi_sync_slave_enabled, MySQL 8.0.26 and later rpl_semi_sync_replica_enabled, and its replication threads; Rpl_semi_sync_master_clients counts them): the primary switches back once one catches up"))
		}
		if either("rpl_semi_sync_source_wait_no_replica", "rpl_semi_sync_master_wait_no_slave") == "OFF" {
			d.Risks = append(d.Risks, risk("semi-synchronous replication does not wait when no replica is connected (wait_no_slave OFF): the primary falls back to asynchronous at once when its replicas disconnect, and a failover then loses acknowledged effects",
				"SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON (MySQL 8.0.26 and later: rpl_semi_sync_source_wait_no_replica), and in the server's configuration"))
		}
		timeout := either("rpl_semi_sync_source_timeout", "rpl_semi_sync_master_timeout")
		if ms, err := strconv.ParseInt(timeout, 10, 64); err == nil && ms < semiSyncFallback {
			d.Risks = append(d.Risks, risk("semi-synchronous replication falls back to asynchronous when no replica acknowledges within "+timeout+" ms: a failover after that loses acknowledged effects",
				"raise rpl_semi_sync_source_timeout (MariaDB rpl_semi_sync_master_timeout) above your failover's detection time, and the clients' read timeout above it (mysqlinbox: readTimeout in the DSN)"))
		}
	}
	return d
}

// SQLiteDurability turns SQLite's synchronous pragma (0 OFF, 1 NORMAL,
// 2 FULL, 3 EXTRA) into risks: OFF leaves the flush to the operating
// system, so a crash of the machine can lose or corrupt acknowledged
// commits. NORMAL in WAL mode (sqliteinbox.Open's) is durable across a
// crash of the application and may lose the last commits in a power loss.
func SQLiteDurability(synchronous int, journalMode string) idemstore.Durability {
	d := idemstore.Durability{Settings: map[string]string{
		"synchronous":  strconv.Itoa(synchronous),
		"journal_mode": journalMode,
	}}
	if synchronous == 0 {
		d.Risks = append(d.Risks, risk("synchronous is OFF: SQLite does not wait for the disk, so a crash of the machine can lose or corrupt commits whose messages idem has acked",
			"open the database with _pragma=synchronous(NORMAL) in WAL mode (as sqliteinbox.Open does), or FULL"))
	}
	return d
}

func risk(what, fix string) idemstore.DurabilityRisk {
	return idemstore.DurabilityRisk{What: what, Fix: fix}
}
