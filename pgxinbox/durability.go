package pgxinbox

import (
	"context"
	"fmt"
	"strconv"

	"github.com/idemkit/idem"
)

// Durability reads the settings that decide whether a commit the server
// acknowledged survives a crash or a failover ([idem.DurabilityChecker]),
// as the store's own connections see them (a role's or a URL's
// synchronous_commit counts): synchronous_commit, synchronous_standby_names,
// fsync, and the streaming standbys connected to the server. The risks:
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
// A standby that is disconnected when Durability runs is not counted.
func (s *Store) Durability(ctx context.Context) (idem.Durability, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return idem.Durability{}, fmt.Errorf("pgxinbox: reading durability settings: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var syncCommit, standbyNames, fsync string
	var recovery bool
	var standbys, syncStandbys int
	err = tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
	current_setting('fsync'), pg_is_in_recovery(),
	(SELECT count(*) FROM pg_stat_replication),
	(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))`).
		Scan(&syncCommit, &standbyNames, &fsync, &recovery, &standbys, &syncStandbys)
	if err != nil {
		return idem.Durability{}, fmt.Errorf("pgxinbox: reading durability settings: %w", err)
	}
	return durability(syncCommit, standbyNames, fsync, recovery, standbys, syncStandbys), nil
}

// durability turns the settings read into risks.
func durability(syncCommit, standbyNames, fsync string, recovery bool, standbys, syncStandbys int) idem.Durability {
	d := idem.Durability{Settings: map[string]string{
		"synchronous_commit":        syncCommit,
		"synchronous_standby_names": strconv.Quote(standbyNames),
		"fsync":                     fsync,
		"in_recovery":               strconv.FormatBool(recovery),
		"streaming_standbys":        strconv.Itoa(standbys),
		"synchronous_standbys":      strconv.Itoa(syncStandbys),
	}}
	risk := func(what, fix string) { d.Risks = append(d.Risks, idem.DurabilityRisk{What: what, Fix: fix}) }
	if fsync == "off" {
		risk("fsync is off: a crash of the server can lose commits it acknowledged, whose messages idem has acked",
			"set fsync = on in postgresql.conf")
	}
	switch {
	case syncCommit == "off":
		risk("synchronous_commit is off: the server acknowledges a commit before its WAL is flushed, so a crash loses the last acknowledged effects while their messages stay acked",
			"ALTER ROLE <consumer role> SET synchronous_commit = on (or remove the override from the connection URL)")
	case standbyNames == "" && standbys > 0:
		risk(fmt.Sprintf("%d streaming standby(s) replicate asynchronously (synchronous_standby_names is empty): a failover to a standby that had not received the last commits loses their effects while their messages stay acked", standbys),
			"set synchronous_standby_names to the standbys' application_name (e.g. 'ANY 1 (replica1, replica2)') and synchronous_commit = on or remote_apply; see the README, Running on clusters")
	case standbyNames != "" && syncCommit == "local":
		risk("synchronous_commit is local: commits are acknowledged before the synchronous standby has them, so a failover can lose acknowledged effects",
			"ALTER ROLE <consumer role> SET synchronous_commit = on (or remote_apply)")
	}
	return d
}
