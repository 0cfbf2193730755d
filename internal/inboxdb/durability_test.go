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
	on := map[string]string{"rpl_semi_sync_master_enabled": "ON", "rpl_semi_sync_master_timeout": "3600000"}
	for _, c := range []struct {
		name                 string
		flushLog, syncBinlog string
		logBin               bool
		replicas             int
		semiSync             map[string]string
		want                 []string
	}{
		{name: "single server, defaults", flushLog: "1", syncBinlog: "0"},
		{name: "binary log synced, semi-sync", flushLog: "1", syncBinlog: "1", logBin: true, replicas: 2, semiSync: on},
		{name: "flush once a second", flushLog: "2", syncBinlog: "1", want: []string{"innodb_flush_log_at_trx_commit is 2"}},
		{name: "binary log not synced", flushLog: "1", syncBinlog: "0", logBin: true, want: []string{"sync_binlog is 0"}},
		{name: "asynchronous replicas", flushLog: "1", syncBinlog: "1", logBin: true, replicas: 1, want: []string{"1 replica(s) replicate asynchronously"}},
		{name: "semi-sync with the default timeout", flushLog: "1", syncBinlog: "1", logBin: true, replicas: 1,
			semiSync: map[string]string{"rpl_semi_sync_source_enabled": "ON", "rpl_semi_sync_source_timeout": "10000"}, want: []string{"falls back to asynchronous"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := MySQLDurability(c.flushLog, c.syncBinlog, c.logBin, c.replicas, c.semiSync)
			if len(d.Risks) != len(c.want) {
				t.Fatalf("risks = %v, want %d", d.Risks, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(d.Risks[i].What, w) || d.Risks[i].Fix == "" {
					t.Errorf("risk %d = %v, want one saying %q with a fix", i, d.Risks[i], w)
				}
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
