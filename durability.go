package idem

import (
	"context"
	"slices"
	"strings"
)

// Durability is what a store's database says about whether a commit it
// acknowledges survives the loss of the server: the settings read, and
// each way an acknowledged effect could still be lost.
//
// The hazard it names is the one the inbox cannot guard against by
// itself: idem acks the broker only after the database acknowledged the
// COMMIT of effect and marker, so a commit the database acknowledges and
// then forgets (an asynchronous standby promoted before it received the
// commit, a crash with synchronous_commit off) leaves the message acked
// and its effect gone.
type Durability struct {
	// Settings are the settings read, by name (synchronous_commit,
	// synchronous_standby_names, the number of streaming standbys, ...).
	Settings map[string]string
	// Risks are the ways an acknowledged effect could be lost, each with
	// its fix. None means the settings keep every acknowledged commit
	// across the failures they cover.
	Risks []DurabilityRisk
}

// DurabilityRisk is one way an acknowledged effect could be lost.
type DurabilityRisk struct {
	What string
	Fix  string
}

// String is the risk and its fix on one line.
func (r DurabilityRisk) String() string { return r.What + " (fix: " + r.Fix + ")" }

// Summary is the settings read, in a stable order, on one line.
func (d Durability) Summary() string {
	var b strings.Builder
	for _, k := range sortedKeys(d.Settings) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + "=" + d.Settings[k])
	}
	return b.String()
}

// DurabilityChecker is a store that can read its database's commit and
// replication settings. [Processor.Check] asks it at start and logs every
// risk as a warning; a consumer still starts (running on asynchronous
// replication can be a deliberate choice), and a store that cannot read
// the settings is logged, not refused.
type DurabilityChecker interface {
	Durability(ctx context.Context) (Durability, error)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
