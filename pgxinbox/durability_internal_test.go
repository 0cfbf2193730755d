package pgxinbox

import (
	"strings"
	"testing"
)

func TestDurabilityRisks(t *testing.T) {
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
			d := durability(c.syncCommit, c.names, c.fsync, false, c.standbys, c.syncStandbys)
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
