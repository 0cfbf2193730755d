package inboxdb

import (
	"strings"
	"testing"
)

func TestPostgresDurability(t *testing.T) {
	for _, c := range []struct {
		name                     string
		syncCommit, names, fsync string
		standbys, syncStandbys   int
		want                     []string // a phrase of each risk, in order
	}{
		{name: "single server, defaults", syncCommit: "on", fsync: "on"},
		{name: "synchronous standby", syncCommit: "on", names: "replica1", fsync: "on", standbys: 1, syncStandbys: 1},
		{name: "remote_apply", syncCommit: "remote_apply", names: "ANY 1 (a, b)", fsync: "on", standbys: 2, syncStandbys: 2},
		{name: "asynchronous standby", syncCommit: "on", fsync: "on", standbys: 2, want: []string{"2 streaming standby(s) replicate asynchronously"}},
		{name: "synchronous_commit off", syncCommit: "off", fsync: "on", want: []string{"synchronous_commit is off"}},
		{name: "local with a synchronous standby", syncCommit: "local", names: "replica1", fsync: "on", standbys: 1, syncStandbys: 1, want: []string{"synchronous_commit is local"}},
		{name: "fsync off", syncCommit: "on", fsync: "off", want: []string{"fsync is off"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := PostgresDurability(c.syncCommit, c.names, c.fsync, false, c.standbys, c.syncStandbys)
			if len(d.Risks) != len(c.want) {
				t.Fatalf("risks = %v, want %d", d.Risks, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(d.Risks[i].What, w) || d.Risks[i].Fix == "" {
					t.Errorf("risk %d = %v, want one saying %q with a fix", i, d.Risks[i], w)
				}
			}
			if d.Settings["synchronous_commit"] != c.syncCommit {
				t.Errorf("settings = %v", d.Settings)
			}
		})
	}
}

func TestMySQLDurability(t *testing.T) {
	on := map[string]string{"rpl_semi_sync_master_enabled": "ON", "rpl_semi_sync_master_timeout": "3600000",
		"rpl_semi_sync_master_wait_point": "AFTER_SYNC", "rpl_semi_sync_master_wait_no_slave": "ON", "rpl_semi_sync_master_status": "ON"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for k, v := range on {
			m[k] = v
		}
		m[k] = v
		return m
	}
	source := map[string]string{"rpl_semi_sync_source_enabled": "ON", "rpl_semi_sync_source_timeout": "3600000",
		"rpl_semi_sync_source_wait_point": "AFTER_SYNC", "rpl_semi_sync_source_wait_no_replica": "ON", "rpl_semi_sync_source_status": "ON"}
	for _, c := range []struct {
		name                 string
		mariadb              bool
		flushLog, syncBinlog string
		logBin               bool
		replicas             int
		semiSync             map[string]string
		want                 []string
		replicasSetting      string // Settings["replicas"] when not the count
	}{
		{name: "single server, defaults", flushLog: "1", syncBinlog: "0"},
		{name: "binary log synced, semi-sync", flushLog: "1", syncBinlog: "1", logBin: true, replicas: 2, semiSync: on},
		{name: "MySQL 8.0.26 names", flushLog: "1", syncBinlog: "1", logBin: true, replicas: 2, semiSync: source},
		{name: "flush once a second", flushLog: "2", syncBinlog: "1", want: []string{"innodb_flush_log_at_trx_commit is 2"}},
		{name: "MariaDB flushes at commit with 3", mariadb: true, flushLog: "3", syncBinlog: "1"},
		{name: "MySQL has no 3", flushLog: "3", syncBinlog: "1", want: []string{"innodb_flush_log_at_trx_commit is 3"}},
		{name: "MariaDB flush once a second", mariadb: true, flushLog: "2", syncBinlog: "1", want: []string{"innodb_flush_log_at_trx_commit is 2"}},
		{name: "binary log not synced", flushLog: "1", syncBinlog: "0", logBin: true, want: []string{"sync_binlog is 0: a crash of the operating system or a power loss"}},
		{name: "asynchronous replicas", flushLog: "1", syncBinlog: "1", logBin: true, replicas: 1, want: []string{"1 replica(s) replicate asynchronously"}},
		{name: "replicas unknown", flushLog: "1", syncBinlog: "1", logBin: true, replicas: MySQLUnknownReplicas, replicasSetting: "unknown (no PROCESS privilege)"},
		{name: "semi-sync with the default timeout", flushLog: "1", syncBinlog: "1", logBin: true, replicas: 1,
			semiSync: with("rpl_semi_sync_master_timeout", "10000"), want: []string{"falls back to asynchronous when no replica acknowledges within 10000 ms"}},
		{name: "semi-sync waiting after commit (MariaDB's default)", mariadb: true, flushLog: "1", syncBinlog: "1", logBin: true, replicas: 1,
			semiSync: with("rpl_semi_sync_master_wait_point", "AFTER_COMMIT"), want: []string{"waits AFTER_COMMIT"}},
		{name: "semi-sync fallen back", flushLog: "1", syncBinlog: "1", logBin: true, replicas: 1,
			semiSync: with("rpl_semi_sync_master_status", "OFF"), want: []string{"its status is OFF"}},
		{name: "semi-sync fallen back, MySQL 8.0.26 names", flushLog: "1", syncBinlog: "1", logBin: true,
			semiSync: map[string]string{"rpl_semi_sync_source_enabled": "ON", "rpl_semi_sync_source_timeout": "3600000", "rpl_semi_sync_source_status": "OFF"}, want: []string{"its status is OFF"}},
		{name: "semi-sync not waiting without replicas", mariadb: true, flushLog: "1", syncBinlog: "1", logBin: true, replicas: 1,
			semiSync: with("rpl_semi_sync_master_wait_no_slave", "OFF"), want: []string{"does not wait when no replica is connected"}},
		{name: "MariaDB's semi-sync defaults, enabled", mariadb: true, flushLog: "1", syncBinlog: "1", logBin: true, replicas: 1,
			semiSync: map[string]string{"rpl_semi_sync_master_enabled": "ON", "rpl_semi_sync_master_timeout": "10000", "rpl_semi_sync_master_wait_point": "AFTER_COMMIT",
				"rpl_semi_sync_master_wait_no_slave": "ON", "rpl_semi_sync_master_status": "ON"},
			want: []string{"waits AFTER_COMMIT", "within 10000 ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := MySQLDurability(c.mariadb, c.flushLog, c.syncBinlog, c.logBin, c.replicas, c.semiSync)
			if len(d.Risks) != len(c.want) {
				t.Fatalf("risks = %v, want %d", d.Risks, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(d.Risks[i].What, w) || d.Risks[i].Fix == "" {
					t.Errorf("risk %d = %v, want one saying %q with a fix", i, d.Risks[i], w)
				}
			}
			if c.replicasSetting != "" && d.Settings["replicas"] != c.replicasSetting {
				t.Errorf("replicas setting %q, want %q", d.Settings["replicas"], c.replicasSetting)
			}
		})
	}
}

func TestSQLiteDurability(t *testing.T) {
	if d := SQLiteDurability(1, "wal"); len(d.Risks) != 0 {
		t.Fatalf("NORMAL in WAL mode: risks %v", d.Risks)
	}
	if d := SQLiteDurability(0, "wal"); len(d.Risks) != 1 || !strings.Contains(d.Risks[0].What, "synchronous is OFF") {
		t.Fatalf("OFF: risks %v", d.Risks)
	}
}
