package inboxdb

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retention"
)

// DefaultWindow is the window Migrate stores for a new table when none is
// configured.
const DefaultWindow = retention.DefaultWindow

// MinWindow is the shortest window SetWindow accepts without force: a
// window of minutes would expire ordinary redeliveries after a restart.
const MinWindow = time.Hour

const day = 24 * time.Hour

// Inbox is the store-independent logic of one inbox table: migrate, the
// stored settings, prune and stats, over a [Driver] and a [Dialect].
type Inbox struct {
	D      *Dialect
	Driver Driver
	// Window is the configured window: written by Migrate on a new table,
	// and compared with the stored one on an existing table. 0: none.
	Window time.Duration
	// Hooks receive retention metrics (the retention package's hook
	// interfaces), labelled with the table's name as written
	// ([Table.String]). Optional.
	Hooks []idem.Hook
	// Logger logs window changes; never nil.
	Logger *slog.Logger

	summaries summaryCache
	pauses    pausesSeen
}

// Label is the table label of every metric and log line about the inbox:
// the same for both stores.
func (b *Inbox) Label() string { return b.D.Table.String() }

// stored is what the settings table holds for an inbox.
type stored struct {
	idemstore.Settings
	// Guard is the longest horizon a consumer may guard with now: the
	// window, except while a lengthening ramps up (see SetWindow).
	Guard time.Duration
	// Prune is the window prunes keep markers for now: the window, except
	// for ShrinkGrace after a shortening, when it is the old window.
	Prune time.Duration
}

// ShrinkGrace is how long after a shortening of the window the prune still
// keeps markers for the old one: processors read the settings again every
// minute, and before each retry of a message waiting out an outage.
const ShrinkGrace = 10 * time.Minute

// readSettings reads the stored settings; found is false when the table has
// none (not migrated by a build that stores them).
func (b *Inbox) readSettings(ctx context.Context, c Conn) (s stored, found bool, err error) {
	var layout string
	var ms int64
	var prev, since *int64
	err = c.QueryRow(ctx, b.D.ReadSettings, b.D.Table.Quoted()).Scan(&layout, &ms, &prev, &since)
	switch {
	case isNoRows(err):
		return s, false, nil
	case err != nil:
		return s, false, fmt.Errorf("reading the inbox settings: %w", err)
	}
	switch layout {
	case idemstore.LayoutPlain.String():
		s.Layout = idemstore.LayoutPlain
	case idemstore.LayoutPartitioned.String():
		s.Layout = idemstore.LayoutPartitioned
	default:
		return s, true, fmt.Errorf("%w: table %s is recorded with an unknown layout %q", idem.ErrConfig, b.D.Table, layout)
	}
	s.Window = time.Duration(ms) * time.Millisecond
	s.Guard, s.Prune = s.Window, s.Window
	if prev != nil && since != nil {
		switch p := time.Duration(*prev) * time.Millisecond; {
		case p < s.Window:
			// Lengthened: markers older than the previous window may be
			// gone, so the guard grows from it one second per second, up
			// to the new window.
			if g := time.Duration(*prev+max(*since, 0)) * time.Millisecond; g < s.Window {
				s.Guard = g
			}
		case p > s.Window && time.Duration(*since)*time.Millisecond < ShrinkGrace:
			// Shortened: processors guard with the new window from their
			// next read of the settings, which may be up to a minute away
			// (longer for a message waiting out an outage): until then
			// the prune keeps markers for the old one.
			s.Prune = p
		}
	}
	return s, true, nil
}

// Settings reads the settings stored with the table, for processors: the
// layout, and as Window the longest horizon a consumer may guard with now,
// which is the stored window except while a lengthening ramps up (see
// SetWindow). A table without settings is a configuration error: its
// store's Migrate has not run since they exist.
func (b *Inbox) Settings(ctx context.Context) (idemstore.Settings, error) {
	return b.settings(ctx, b.read)
}

// SettingsIn is Settings read on c, a transaction the caller holds, so
// that a caller on a pool of one needs no second connection.
func (b *Inbox) SettingsIn(ctx context.Context, c Conn) (idemstore.Settings, error) {
	return b.settings(ctx, on(c))
}

func (b *Inbox) settings(ctx context.Context, read reader) (idemstore.Settings, error) {
	s, err := b.storedVia(ctx, read)
	if err != nil {
		return idemstore.Settings{}, err
	}
	return idemstore.Settings{Layout: s.Layout, Window: s.Guard, Stored: s.Window}, nil
}

// Stored reads the stored window and the guard window in force (shorter
// while a lengthening ramps up).
func (b *Inbox) Stored(ctx context.Context) (window, guard time.Duration, err error) {
	s, err := b.stored(ctx)
	return s.Window, s.Guard, err
}

func (b *Inbox) stored(ctx context.Context) (stored, error) { return b.storedVia(ctx, b.read) }

func (b *Inbox) storedVia(ctx context.Context, read reader) (stored, error) {
	var s stored
	var found bool
	err := read(ctx, func(c Conn) (err error) {
		s, found, err = b.readSettings(ctx, c)
		return err
	})
	if err != nil {
		return s, fmt.Errorf("inbox table %s: %w", b.D.Table, err)
	}
	if !found {
		return s, fmt.Errorf("%w: inbox table %s has no stored retention window: run its store's Migrate", idem.ErrConfig, b.D.Table)
	}
	return s, nil
}

// read runs f for reads.
func (b *Inbox) read(ctx context.Context, f func(Conn) error) error {
	return b.Driver.Read(ctx, f)
}

// reader runs f on a session: the driver's own (Inbox.read), or one the
// caller holds (on).
type reader func(ctx context.Context, f func(Conn) error) error

// on is the reader that runs on c.
func on(c Conn) reader {
	return func(_ context.Context, f func(Conn) error) error { return f(c) }
}

// now reads the database's clock on c: every instance prunes by the clock
// that wrote processed_at and keep_until.
func (b *Inbox) now(ctx context.Context, c Conn) (time.Time, error) {
	var v any
	if err := c.QueryRow(ctx, b.D.Now).Scan(&v); err != nil {
		return time.Time{}, fmt.Errorf("reading the database clock: %w", err)
	}
	return b.D.ScanTime(v)
}

// Now reads the database's clock.
func (b *Inbox) Now(ctx context.Context) (now time.Time, err error) {
	err = b.read(ctx, func(c Conn) (err error) { now, err = b.now(ctx, c); return err })
	return now, err
}

// PruneWindow returns the window a prune or a partition drop removes
// markers by: requested, or the stored window when requested is 0. A
// requested window shorter than the stored one is refused, with both
// numbers: consumers accept messages that old, and their markers must stay.
func (b *Inbox) PruneWindow(ctx context.Context, requested time.Duration) (time.Duration, error) {
	if requested < 0 {
		return 0, fmt.Errorf("window %v must be positive", requested)
	}
	s, err := b.stored(ctx)
	if err != nil {
		return 0, err
	}
	if requested == 0 {
		return s.Prune, nil
	}
	if requested < s.Window {
		return 0, fmt.Errorf("%w: window %v is shorter than the window stored with table %s, %v: consumers accept messages that old, and their markers must stay "+
			"(to change the stored window for every consumer: idem inbox window set <duration> --table %s)",
			retention.ErrShortWindow, requested, b.D.Table, s.Window, b.D.Table)
	}
	return max(requested, s.Prune), nil
}

// Prune deletes the markers whose keep_until is older than the window (the
// stored one unless opts asks for a longer one), in batches of
// opts.BatchSize. Each batch is one transaction on the elected session: its
// DELETE and the growth of the pruned-key summaries by the keys it deleted
// commit together, so a marker never leaves the inbox without its key in a
// summary. A run killed at any instant leaves whole batches done or not, and
// a COMMIT whose outcome is unknown did both or neither; the next run goes
// on from there. Plain layout only.
func (b *Inbox) Prune(ctx context.Context, opts retention.Options) (res retention.Result, err error) {
	res.DryRun = opts.DryRun
	window, err := b.PruneWindow(ctx, opts.Window)
	if err != nil {
		return res, fmt.Errorf("pruning inbox: %w", err)
	}
	opts = opts.WithDefaults(window)
	if err := opts.Validate(); err != nil {
		return res, fmt.Errorf("pruning inbox: %w", err)
	}
	hooks := opts.Hooks
	if len(hooks) == 0 {
		hooks = b.Hooks
	}
	sess, release, ok, err := b.Driver.Lead(ctx, b.D)
	if err != nil {
		return res, fmt.Errorf("pruning inbox: %w", err)
	}
	if !ok {
		res.Skipped = true
		return res, nil
	}
	defer release()
	now, err := b.now(ctx, sess)
	if err != nil {
		return res, fmt.Errorf("pruning inbox: %w", err)
	}
	res.Cutoff = now.Add(-opts.Window)
	cutoff := b.D.TimeArg(res.Cutoff)
	if opts.DryRun {
		if err := sess.QueryRow(ctx, b.D.Prunable, cutoff).Scan(&res.Markers); err != nil {
			return res, fmt.Errorf("counting prunable markers: %w", err)
		}
		return res, nil
	}
	defer func() { idem.Each(hooks, func(h retention.PruneHook) { h.OnPrune(b.Label(), res.Markers) }) }()
	summarised := map[string]bool{}
	defer func() { res.Summaries = len(summarised) }()
	for {
		n, err := b.pruneBatch(ctx, sess, cutoff, now, opts, summarised)
		if err != nil {
			return res, fmt.Errorf("pruning inbox: %w", err)
		}
		res.Batches++
		res.Markers += n
		if n < int64(opts.BatchSize) {
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("pruning inbox: %w", err)
		}
	}
}

// pruneBatch deletes one batch of markers older than cutoff and summarises
// their keys, in one transaction on the leader's session, and returns how
// many it deleted. The summaries' lock is taken first, so that writers of
// the summaries (a prune whose leader's session was lost and another one
// elected meanwhile) read, grow and write them back one at a time.
// summarised collects the consumers whose summaries it wrote.
func (b *Inbox) pruneBatch(ctx context.Context, sess Session, cutoff any, now time.Time, opts retention.Options, summarised map[string]bool) (int64, error) {
	tx, err := sess.BeginBatch(ctx)
	if err != nil {
		return 0, fmt.Errorf("beginning a prune batch: %w", err)
	}
	defer rollback(ctx, tx)
	if b.D.SummaryLock != "" && opts.Summaries.Keep >= 0 {
		if _, err := tx.Exec(ctx, b.D.SummaryLock, b.D.Table.Quoted()); err != nil {
			return 0, fmt.Errorf("locking the pruned-key summaries: %w", err)
		}
	}
	keys := pruned{}
	var n int64
	err = tx.Query(ctx, b.D.PruneBatch, func(r Row) error {
		n++
		return keys.add(r)
	}, cutoff, opts.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("deleting a batch of markers: %w", err)
	}
	if n == 0 {
		return 0, nil
	}
	if _, err := b.recordPruned(ctx, tx, keys, now, "", opts.Summaries); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		// Unknown or refused, the batch's DELETE and its summary went
		// together: a rerun deletes what is still there.
		return 0, fmt.Errorf("committing a prune batch: %w", err)
	}
	if opts.Summaries.Keep >= 0 {
		for c := range keys {
			summarised[c] = true
		}
	}
	return n, nil
}

// Stats reads the inbox's figures for its stored window, in one scan, and
// reports the oldest marker's age to the hooks. On the partitioned layout
// the retention time is the partition time, and what is prunable is what
// the next drop of whole days removes.
func (b *Inbox) Stats(ctx context.Context) (retention.Stats, error) {
	st := retention.Stats{Table: b.Label()}
	set, err := b.stored(ctx)
	if err != nil {
		return st, fmt.Errorf("reading inbox stats: %w", err)
	}
	st.Window = set.Window
	err = b.read(ctx, func(c Conn) error {
		var err error
		if st.Now, err = b.now(ctx, c); err != nil {
			return err
		}
		cutoff := st.Now.Add(-st.Window)
		if b.D.Layout == idemstore.LayoutPartitioned {
			cutoff = cutoff.UTC().Truncate(day)
		}
		var oldest any
		if err := c.QueryRow(ctx, b.D.Stats, b.D.TimeArg(cutoff)).Scan(&st.Rows, &st.NoEventTime, &oldest, &st.Prunable); err != nil {
			return err
		}
		st.Oldest, err = b.D.ScanTime(oldest)
		return err
	})
	if err != nil {
		return st, fmt.Errorf("reading inbox stats: %w", err)
	}
	st.Finish()
	if st.Rows > 0 {
		idem.Each(b.Hooks, func(h retention.OldestHook) { h.OnOldest(b.Label(), st.OldestAge) })
	}
	return st, nil
}

// Horizon is the horizon a consumer of the inbox last reported.
type Horizon = retention.RecordedHorizon

// RecordHorizon records the horizon window consumer guards with (upsert,
// with the time seen). A guard that is off (window <= 0) records nothing.
func (b *Inbox) RecordHorizon(ctx context.Context, consumer string, window time.Duration) error {
	if window <= 0 {
		return nil
	}
	tx, err := b.Driver.Begin(ctx)
	if err != nil {
		return fmt.Errorf("recording the horizon of %s: %w", consumer, err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, b.D.RecordHorizon, b.D.Table.Quoted(), consumer, window.Milliseconds()); err != nil {
		return fmt.Errorf("recording the horizon of %s: %w", consumer, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("recording the horizon of %s: %w", consumer, err)
	}
	return nil
}

// Horizons lists the recorded horizons, longest first.
func (b *Inbox) Horizons(ctx context.Context) ([]Horizon, error) {
	var out []Horizon
	err := b.read(ctx, func(c Conn) (err error) { out, err = b.horizons(ctx, c); return err })
	return out, err
}

// horizons reads the recorded horizons on c, longest first. Conn offers
// single rows only, so they are read one query per row, by offset: the
// list is one row per consumer.
func (b *Inbox) horizons(ctx context.Context, c Conn) ([]Horizon, error) {
	var out []Horizon
	for i := 0; ; i++ {
		var h Horizon
		var ms int64
		var seen any
		err := c.QueryRow(ctx, b.D.Horizons+" LIMIT 1 OFFSET "+fmt.Sprint(i), b.D.Table.Quoted()).Scan(&h.Consumer, &ms, &seen)
		if isNoRows(err) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the recorded horizons: %w", err)
		}
		h.Window = time.Duration(ms) * time.Millisecond
		if h.SeenAt, err = b.D.ScanTime(seen); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
}

// SetWindow changes the window stored with the table, the one explicit
// operation that does (docs/design.md 10), and logs the old and new values. It
// refuses, unless force is set, a window under [MinWindow] and one shorter
// than the longest horizon a consumer recorded: that consumer would accept
// messages whose markers the prune removes. It returns the old window.
//
// Lengthening is always allowed, and the prune keeps markers for the new
// window at once; but markers older than the old window may already be
// gone, so the guard window processors read ([Inbox.Settings]) grows from
// the old window one second per second until it reaches the new one: no
// consumer accepts a message whose marker a prune by the old window
// removed.
func (b *Inbox) SetWindow(ctx context.Context, w time.Duration, force bool) (old time.Duration, err error) {
	if w <= 0 {
		return 0, fmt.Errorf("setting the window of %s: %v must be positive", b.D.Table, w)
	}
	if w%time.Millisecond != 0 {
		return 0, fmt.Errorf("setting the window of %s: %v is not a whole number of milliseconds", b.D.Table, w)
	}
	tx, err := b.Driver.BeginMigration(ctx)
	if err != nil {
		return 0, fmt.Errorf("setting the window of %s: %w", b.D.Table, err)
	}
	defer rollback(ctx, tx)
	for _, q := range b.D.Bookkeeping {
		if _, err := tx.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("setting the window of %s: %w", b.D.Table, err)
		}
	}
	set, found, err := b.readSettings(ctx, tx)
	if err != nil {
		return 0, fmt.Errorf("setting the window of %s: %w", b.D.Table, err)
	}
	if !found {
		return 0, fmt.Errorf("%w: setting the window of %s: the table has no stored settings: run its store's Migrate first", idem.ErrConfig, b.D.Table)
	}
	old = set.Window
	if w < MinWindow && !force {
		return old, fmt.Errorf("setting the window of %s to %v (now %v): under %v it would expire ordinary redeliveries; force it if you mean it",
			b.D.Table, w, old, MinWindow)
	}
	hs, err := b.horizons(ctx, tx)
	if err != nil {
		return old, fmt.Errorf("setting the window of %s: %w", b.D.Table, err)
	}
	if len(hs) > 0 && w < hs[0].Window && !force {
		h := hs[0]
		return old, fmt.Errorf("setting the window of %s to %v (now %v): consumer %s guards with a horizon of %v (recorded %s): "+
			"it would accept messages whose markers the prune removes; shorten its horizon first, or force it",
			b.D.Table, w, old, h.Consumer, h.Window, h.SeenAt.UTC().Format(time.RFC3339))
	}
	var prev any
	switch {
	case w > set.Guard:
		prev = set.Guard.Milliseconds() // the guard ramps up from where it is
	case w < set.Prune:
		prev = set.Prune.Milliseconds() // the prune keeps the old window a while
	}
	if _, err := tx.Exec(ctx, b.D.UpdateWindow, b.D.Table.Quoted(), w.Milliseconds(), prev); err != nil {
		return old, fmt.Errorf("setting the window of %s: %w", b.D.Table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return old, fmt.Errorf("setting the window of %s: %w", b.D.Table, err)
	}
	level := slog.LevelInfo
	if w < old {
		level = slog.LevelWarn
	}
	attrs := []any{"table", b.Label(), "old", old, "new", w, "forced", force}
	if prev != nil {
		attrs = append(attrs, "guard_reaches_new_window_in", w-set.Guard)
	}
	b.Logger.Log(ctx, level, "inbox retention window changed", attrs...)
	return old, nil
}
