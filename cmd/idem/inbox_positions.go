package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// positionStore is what the positions commands need of a store.
type positionStore interface {
	Positions(ctx context.Context, consumer string) ([]idemstore.Position, error)
	ForgetPositions(ctx context.Context, consumer string) (int64, error)
}

// openPositions parses the flags of a positions command, which need
// --consumer, and opens its store.
func openPositions(ctx context.Context, f *inboxFlags, consumer *string, args []string) (positionStore, func(), error) {
	if err := f.parse(args); err != nil {
		return nil, nil, err
	}
	if err := f.noWindow(); err != nil {
		return nil, nil, err
	}
	if *consumer == "" {
		return nil, nil, f.fs.usagef("want --consumer, the consumer whose positions these are")
	}
	store, _, closeDB, err := f.openWindowStore(ctx)
	if err != nil {
		return nil, nil, err
	}
	ps, ok := store.(positionStore)
	if !ok {
		closeDB()
		return nil, nil, fmt.Errorf("this store records no positions")
	}
	return ps, closeDB, nil
}

func inboxPositionsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("positions show", "Prints the position a consumer of a log broker (idemkafka with Config.Positions)\nrecorded for each partition: every record before it is settled, as far as this\ndatabase can vouch. A consumer whose partitions the broker committed past these\nrewinds to them, or refuses them.", stdout, stderr, true)
	consumer := f.fs.String("consumer", "", "the consumer (idem.Config.Consumer)")
	store, closeDB, err := openPositions(ctx, f, consumer, args)
	if err != nil {
		return err
	}
	defer closeDB()
	ps, err := store.Positions(ctx, *consumer)
	if err != nil {
		return err
	}
	if f.jsonOut {
		out := make([]map[string]any, len(ps))
		for i, p := range ps {
			out[i] = map[string]any{"source": p.Source, "next": p.Next, "updated_at": p.Updated}
		}
		return printJSON(stdout, map[string]any{"consumer": *consumer, "positions": out})
	}
	if len(ps) == 0 {
		_, err := fmt.Fprintf(stdout, "no positions recorded for %s: its consumers trust the broker's committed offsets\n", *consumer)
		return err
	}
	for _, p := range ps {
		if _, err := fmt.Fprintf(stdout, "%-40s %12d  %s\n", p.Source, p.Next, p.Updated.UTC().Format(time.RFC3339)); err != nil {
			return err
		}
	}
	return nil
}

func inboxPositionsForget(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newInboxFlags("positions forget", "Deletes the positions a consumer recorded, after its database was reset on purpose\n(restored to an earlier state, the lost effects not wanted again): its consumers then\ntrust the broker's committed offsets, and one refusing a partition resumes it.", stdout, stderr, true)
	consumer := f.fs.String("consumer", "", "the consumer (idem.Config.Consumer)")
	store, closeDB, err := openPositions(ctx, f, consumer, args)
	if err != nil {
		return err
	}
	defer closeDB()
	n, err := store.ForgetPositions(ctx, *consumer)
	if err != nil {
		return err
	}
	f.logger.Info("positions forgotten", "consumer", *consumer, "positions", n)
	if f.jsonOut {
		return printJSON(stdout, map[string]any{"consumer": *consumer, "forgotten": n})
	}
	_, err = fmt.Fprintf(stdout, "forgot %d positions of %s\n", n, *consumer)
	return err
}
