package main

import (
	"context"
	"fmt"
	"io"

	"github.com/idemkit/idem/idemstore"
)

// readDurability asks a store that can tell ([idemstore.Store.Durability])
// whether its database could lose commits it acknowledged: nil, nil for a
// store that cannot tell.
func readDurability(ctx context.Context, store any) (*idemstore.Durability, error) {
	dc, ok := store.(interface {
		Durability(context.Context) (idemstore.Durability, error)
	})
	if !ok {
		return nil, nil
	}
	d, err := dc.Durability(ctx)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// printDurability prints the durability warnings of idem inbox check, if
// any. They
// do not change its exit status: a consumer starts on such a database too
// (asynchronous replication can be a deliberate choice), and logs the same
// warnings.
func printDurability(w io.Writer, d *idemstore.Durability, err error) {
	switch {
	case err != nil:
		fmt.Fprintf(w, "durability: could not read the commit and replication settings: %v\n", err)
	case d == nil, len(d.Risks) == 0:
		// Nothing to warn of; --json shows the settings read.
	default:
		for _, r := range d.Risks {
			fmt.Fprintf(w, "warning: acknowledged effects could be lost: %s\n  fix: %s\n", r.What, r.Fix)
		}
		fmt.Fprintf(w, "  (settings: %s; consumers still start and log this warning)\n", d.Summary())
	}
}

// durabilityJSON is the durability part of idem inbox check --json.
func durabilityJSON(d *idemstore.Durability, err error) map[string]any {
	switch {
	case err != nil:
		return map[string]any{"error": err.Error()}
	case d == nil:
		return nil
	}
	risks := make([]map[string]string, len(d.Risks))
	for i, r := range d.Risks {
		risks[i] = map[string]string{"what": r.What, "fix": r.Fix}
	}
	return map[string]any{"settings": d.Settings, "risks": risks}
}
