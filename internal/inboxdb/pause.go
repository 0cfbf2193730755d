package inboxdb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem/idemstore"
)

// ErrNotPaused is returned by [Inbox.Resume] for a consumer that is not
// paused.
var ErrNotPaused = errors.New("consumer is not paused")

// ConsumerPause is one paused consumer of an inbox.
type ConsumerPause struct {
	Consumer string
	idemstore.Pause
}

// pausesSeen remembers that the pauses table exists, so that a processor's
// reads of its pause, after the first, cost one query.
type pausesSeen struct{ ok atomic.Bool }

// Paused reads consumer's pause ([idemstore.Store.Paused]): the zero Pause when
// it is not paused, or when the inbox was migrated before pauses existed.
func (b *Inbox) Paused(ctx context.Context, consumer string) (p idemstore.Pause, err error) {
	err = b.read(ctx, func(c Conn) (err error) { p, err = b.paused(ctx, c, consumer); return err })
	return p, err
}

// PausedIn is Paused read on c, a transaction the caller holds. It never
// fails for a missing pauses table (which would abort a PostgreSQL
// transaction): it asks the catalog first, until it has seen the table.
func (b *Inbox) PausedIn(ctx context.Context, c Conn, consumer string) (idemstore.Pause, error) {
	return b.paused(ctx, c, consumer)
}

func (b *Inbox) paused(ctx context.Context, c Conn, consumer string) (idemstore.Pause, error) {
	var p idemstore.Pause
	if !b.pauses.ok.Load() {
		var n int
		if err := c.QueryRow(ctx, b.D.PausesExist).Scan(&n); err != nil {
			return p, fmt.Errorf("reading the pause of %s: %w", consumer, err)
		}
		switch n {
		case 0:
			return p, nil // migrated before pauses existed: none can be paused
		case 2:
			return p, fmt.Errorf("reading the pause of %s: the role may not read %s (fix: GRANT SELECT ON %[2]s TO the consumer's role)",
				consumer, b.D.Table.Sibling(pausesTable))
		}
		b.pauses.ok.Store(true)
	}
	var at any
	err := c.QueryRow(ctx, b.D.ReadPause, b.D.Table.Quoted(), consumer).Scan(&at, &p.By, &p.Why)
	switch {
	case isNoRows(err):
		return idemstore.Pause{}, nil
	case err != nil:
		return p, fmt.Errorf("reading the pause of %s: %w", consumer, err)
	}
	if p.Since, err = b.D.ScanTime(at); err != nil {
		return p, fmt.Errorf("reading the pause of %s: %w", consumer, err)
	}
	p.Paused = true
	return p, nil
}

// Pauses lists the paused consumers of the inbox, by name.
func (b *Inbox) Pauses(ctx context.Context) ([]ConsumerPause, error) {
	var out []ConsumerPause
	err := b.read(ctx, func(c Conn) error {
		var n int
		if err := c.QueryRow(ctx, b.D.PausesExist).Scan(&n); err != nil || n == 0 {
			return err
		}
		if n == 2 {
			return fmt.Errorf("the role may not read %s", b.D.Table.Sibling(pausesTable))
		}
		return c.Query(ctx, b.D.ListPauses, func(r Row) error {
			var cp ConsumerPause
			var consumer any
			var at any
			if err := r.Scan(&consumer, &at, &cp.By, &cp.Why); err != nil {
				return err
			}
			cp.Consumer = asString(consumer)
			t, err := b.D.ScanTime(at)
			if err != nil {
				return err
			}
			cp.Since, cp.Paused = t, true
			out = append(out, cp)
			return nil
		}, b.D.Table.Quoted())
	})
	if err != nil {
		return nil, fmt.Errorf("listing the paused consumers of %s: %w", b.D.Table, err)
	}
	return out, nil
}

// asString is a text column read into an any: a string, or bytes on
// MySQL's binary columns.
func asString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return fmt.Sprint(v)
}

// Pause pauses consumer: every processor of it reads the pause within
// seconds and holds its messages until [Inbox.Resume]. by and why are kept
// with the pause and in the audit table (idem_consumer_pause_log), with
// the database's time. Pausing a paused consumer changes nothing and
// returns the pause in force, with already set.
func (b *Inbox) Pause(ctx context.Context, consumer, by, why string) (p idemstore.Pause, already bool, err error) {
	if err := checkActor(consumer, by, why); err != nil {
		return p, false, err
	}
	err = b.pauseTx(ctx, func(tx Tx) error {
		n, err := tx.Exec(ctx, b.D.InsertPause, b.D.Table.Quoted(), consumer, by, why)
		if err != nil {
			return err
		}
		if already = n == 0; !already {
			if _, err := tx.Exec(ctx, b.D.LogPause, b.D.Table.Quoted(), consumer, "pause", by, why); err != nil {
				return err
			}
		}
		p, err = b.paused(ctx, tx, consumer)
		return err
	})
	if err != nil {
		return p, false, fmt.Errorf("pausing consumer %s of %s: %w", consumer, b.D.Table, err)
	}
	b.Logger.Warn("consumer paused", "consumer", consumer, "table", b.D.Table.String(), "by", by, "why", why, "already", already)
	return p, already, nil
}

// Resume ends consumer's pause, keeping by and why in the audit table, and
// returns the pause it ended. A consumer that is not paused is refused with
// [ErrNotPaused].
func (b *Inbox) Resume(ctx context.Context, consumer, by, why string) (p idemstore.Pause, err error) {
	if err := checkActor(consumer, by, why); err != nil {
		return p, err
	}
	err = b.pauseTx(ctx, func(tx Tx) error {
		if p, err = b.paused(ctx, tx, consumer); err != nil {
			return err
		}
		n, err := tx.Exec(ctx, b.D.DeletePause, b.D.Table.Quoted(), consumer)
		if err != nil {
			return err
		}
		if n == 0 {
			return ErrNotPaused
		}
		_, err = tx.Exec(ctx, b.D.LogPause, b.D.Table.Quoted(), consumer, "resume", by, why)
		return err
	})
	if err != nil {
		return p, fmt.Errorf("resuming consumer %s of %s: %w", consumer, b.D.Table, err)
	}
	b.Logger.Warn("consumer resumed", "consumer", consumer, "table", b.D.Table.String(), "by", by, "why", why,
		"paused_by", p.By, "paused_since", p.Since)
	return p, nil
}

// checkActor refuses an empty consumer, or an action without who and why.
func checkActor(consumer, by, why string) error {
	switch {
	case strings.TrimSpace(consumer) == "":
		return errors.New("no consumer named")
	case strings.TrimSpace(by) == "":
		return errors.New("who acts is required")
	case strings.TrimSpace(why) == "":
		return errors.New("why is required")
	}
	return nil
}

// pauseTx runs f in a migration transaction, after creating the
// bookkeeping tables (the pauses tables among them) if they are missing.
func (b *Inbox) pauseTx(ctx context.Context, f func(Tx) error) error {
	tx, err := b.Driver.BeginMigration(ctx)
	if err != nil {
		return err
	}
	defer rollback(ctx, tx)
	for _, q := range b.D.Bookkeeping {
		if _, err := tx.Exec(ctx, q); err != nil {
			return err
		}
	}
	b.pauses.ok.Store(true)
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
