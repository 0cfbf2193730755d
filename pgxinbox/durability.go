package pgxinbox

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
)

// Durability reads the settings that decide whether a commit the server
// acknowledged survives a crash or a failover ([idemstore.Store.Durability]),
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
func (s *Store) Durability(ctx context.Context) (idemstore.Durability, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return idemstore.Durability{}, fmt.Errorf("pgxinbox: reading durability settings: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var syncCommit, standbyNames, fsync string
	var recovery bool
	var standbys, syncStandbys int
	if err := tx.QueryRow(ctx, inboxdb.PostgresDurabilitySQL).Scan(&syncCommit, &standbyNames, &fsync, &recovery, &standbys, &syncStandbys); err != nil {
		return idemstore.Durability{}, fmt.Errorf("pgxinbox: reading durability settings: %w", err)
	}
	return inboxdb.PostgresDurability(syncCommit, standbyNames, fsync, recovery, standbys, syncStandbys), nil
}
