package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/internal/pgerr"

	"github.com/idemkit/idem/internal/logfmt"
)

// Defaults of [RelayConfig].
const (
	DefaultBatchSize    = 100
	DefaultPollInterval = time.Second
	DefaultLeaseTerm    = 30 * time.Second
	DefaultMaxAttempts  = 5
)

// DefaultRetryBackoff and DefaultOutageBackoff are the defaults of
// [RelayConfig.RetryBackoff] and [RelayConfig.OutageBackoff].
var (
	DefaultRetryBackoff  = idem.Backoff{Initial: time.Second, Max: time.Minute}
	DefaultOutageBackoff = idem.Backoff{Initial: 200 * time.Millisecond, Max: 30 * time.Second}
)

// RelayConfig configures a [Relay]. The zero value is usable.
type RelayConfig struct {
	// BatchSize is the most records handed to one Publish call. Defaults
	// to 100.
	BatchSize int
	// PollInterval is how often the relay looks for rows when nothing
	// woke it. Defaults to 1 s. With LISTEN/NOTIFY (PostgreSQL through a
	// *pgxpool.Pool or the pgx stdlib driver) it is only the fallback.
	PollInterval time.Duration
	// LeaseTerm is how long a relay's shard leases last unless renewed;
	// a relay that stops answering loses its shards to the others after
	// it. Renewed every third of it. Defaults to 30 s.
	LeaseTerm time.Duration
	// PublishTimeout bounds one Publish call; at most a third of
	// LeaseTerm, so a batch ends before its leases do. Defaults to a
	// third of LeaseTerm.
	PublishTimeout time.Duration
	// MaxAttempts is how many times a record the broker refuses is tried
	// before it is parked. Defaults to 5. Outages never count.
	MaxAttempts int
	// RetryBackoff paces the tries of a record the broker refused: the
	// wait before the second try is RetryBackoff.Initial, doubled after
	// each attempt up to RetryBackoff.Max, without jitter (the time is
	// stored with the row). Defaults to 1 s and 1 min.
	RetryBackoff idem.Backoff
	// OutageBackoff paces the tries after the broker or the database could
	// not be reached: the first wait is OutageBackoff.Initial, doubled
	// (with jitter) on each further failure up to OutageBackoff.Max. It
	// also spaces the reconnections of a lost LISTEN session (without
	// jitter). Defaults to 200 ms and 30 s.
	OutageBackoff idem.Backoff
	// StrictOrder keeps a parked row's later rows of the same key unsent
	// until the row is retried (idem outbox retry) or removed. Without it
	// (the default) a parked row steps aside and its key's later rows
	// flow: parking is an operator's decision to look at that row.
	StrictOrder bool
	// Hooks receive the relay's events: each value is called for the
	// interfaces it implements ([PublishHook], [RefuseHook],
	// [OutageHook]). Optional.
	Hooks []idem.Hook
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Name identifies the relay in the lease table. Defaults to the host
	// name and process ID; a random suffix keeps every Run distinct.
	Name string
}

// Relay publishes committed outbox rows. Rows are spread over shards by
// key; a relay publishes the rows of the shards it holds a lease on, in
// seq order, so several relays, in one process or many, share the work
// without publishing a row twice while their leases hold.
type Relay struct {
	c       *core
	pub     Publisher
	cfg     RelayConfig
	running atomic.Bool

	published, parked atomic.Int64
}

// NewRelay returns a relay of o's rows through pub. It validates cfg; it
// does not touch the database until Run. The caller closes pub after Run
// returned.
func NewRelay[TTx any](o *Outbox[TTx], pub Publisher, cfg *RelayConfig) (*Relay, error) {
	if o == nil || pub == nil {
		return nil, fmt.Errorf("%w: outbox: NewRelay needs an outbox and a publisher", idem.ErrConfig)
	}
	var c RelayConfig
	if cfg != nil {
		c = *cfg
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.LeaseTerm, DefaultLeaseTerm)
	def(&c.PublishTimeout, c.LeaseTerm/3)
	c.RetryBackoff = c.RetryBackoff.WithDefaults(DefaultRetryBackoff)
	c.OutageBackoff = c.OutageBackoff.WithDefaults(DefaultOutageBackoff)
	switch {
	case c.BatchSize < 0 || c.MaxAttempts < 0:
		return nil, fmt.Errorf("%w: outbox: batch size and max attempts must be positive", idem.ErrConfig)
	case c.PollInterval < 0:
		return nil, fmt.Errorf("%w: outbox: durations must be positive", idem.ErrConfig)
	case c.RetryBackoff.Validate() != nil:
		return nil, fmt.Errorf("%w: outbox: retry %w", idem.ErrConfig, c.RetryBackoff.Validate())
	case c.OutageBackoff.Validate() != nil:
		return nil, fmt.Errorf("%w: outbox: outage %w", idem.ErrConfig, c.OutageBackoff.Validate())
	case c.LeaseTerm < 300*time.Millisecond:
		return nil, fmt.Errorf("%w: outbox: lease term %v is shorter than 300ms", idem.ErrConfig, c.LeaseTerm)
	case c.PublishTimeout <= 0 || c.PublishTimeout > c.LeaseTerm/3:
		return nil, fmt.Errorf("%w: outbox: publish timeout %v must be positive and at most a third of the lease term %v, so a batch ends before its leases",
			idem.ErrConfig, c.PublishTimeout, c.LeaseTerm)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	// Durations as text, errors on one line, whatever the handler.
	c.Logger = logfmt.Wrap(c.Logger)
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return &Relay{c: o.core, pub: pub, cfg: c}, nil
}

// Published is how many records this relay has marked sent.
func (r *Relay) Published() int64 { return r.published.Load() }

// Parked is how many records this relay has parked.
func (r *Relay) Parked() int64 { return r.parked.Load() }

// lease is one shard a relay holds.
type lease struct {
	epoch int64
}

// relayState is one Run's: the owner token in the lease table, the
// leases held and until when they are safe to use by the local clock.
// Invariant: a record is published only from a shard in held, before
// deadline, and marked only in a transaction that found the same lease
// (owner and epoch) still unexpired in the database.
type relayState struct {
	owner    string
	shards   int
	held     map[int]lease
	deadline time.Time
	renewAt  time.Time
	retryAt  time.Time // when a refused record is next due; zero: none
	outages  int       // consecutive
}

func (st *relayState) heldShards() []int64 {
	out := make([]int64, 0, len(st.held))
	for s := range st.held {
		out = append(out, int64(s))
	}
	slices.Sort(out)
	return out
}

// Run publishes until ctx is done, then finishes the batch in flight
// (bounded by PublishTimeout), marks it, gives its leases up and returns
// nil. It returns an error only when the outbox cannot be used at all (a
// table that was never migrated); outages of the broker or the database
// are logged, reported to the OutageHook and waited out with backoff.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: this relay is already running")
	}
	defer r.running.Store(false)
	st := &relayState{owner: fmt.Sprintf("%s-%012x", r.cfg.Name, rand.Uint64()>>16), held: map[int]lease{}}
	log := r.cfg.Logger.With("outbox", r.c.table.String(), "relay", st.owner)
	for {
		// A database away at start is waited for; a table that is not
		// there (never migrated) is refused.
		n, err := r.c.shardCount(ctx)
		if err == nil {
			st.shards = n
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrNoTable) || pgerr.Classify(err) == idemstore.ClassConfig {
			return fmt.Errorf("starting the relay: %w", err)
		}
		r.outage(ctx, st, log, err)
	}

	local, unsubscribe := r.c.subscribe()
	defer unsubscribe()
	notified := make(chan struct{}, 1)
	var wg sync.WaitGroup
	lctx, stopListening := context.WithCancel(ctx)
	if r.c.listen != nil {
		wg.Go(func() { r.listen(lctx, log, notified) })
	}
	defer func() {
		stopListening()
		wg.Wait()
		r.stop(st, log)
	}()

	serial := false // the next read waits for enqueuing transactions (SQLite)
	for ctx.Err() == nil {
		now := time.Now()
		if !now.Before(st.renewAt) || st.deadline.Sub(now) < r.cfg.PublishTimeout {
			if err := r.balance(ctx, st); err != nil {
				if ctx.Err() != nil {
					break
				}
				r.outage(ctx, st, log, fmt.Errorf("renewing the shard leases: %w", err))
				continue
			}
		}
		n, err := r.pass(ctx, st, serial)
		serial = false
		if err != nil {
			if ctx.Err() != nil {
				break // stopping: the batch in flight, if any, was marked
			}
			r.outage(ctx, st, log, err)
			continue
		}
		st.outages = 0
		if n == r.cfg.BatchSize {
			continue
		}
		wait := min(r.cfg.PollInterval, time.Until(st.renewAt))
		if !st.retryAt.IsZero() {
			wait = min(wait, time.Until(st.retryAt))
			st.retryAt = time.Time{}
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
		case <-local:
			serial = r.c.serialRead
		case <-notified:
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// listen keeps a LISTEN session open until ctx is done, reconnecting with
// backoff; each notification wakes the relay.
func (r *Relay) listen(ctx context.Context, log *slog.Logger, notified chan<- struct{}) {
	wake := func() {
		select {
		case notified <- struct{}{}:
		default:
		}
	}
	losses := 0
	for ctx.Err() == nil {
		began := time.Now()
		err := r.c.listen(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > r.cfg.OutageBackoff.Max {
			// The session had worked for a while: a new loss starts the
			// backoff over instead of waiting the longest at once.
			losses = 0
		}
		losses++
		wait := r.cfg.OutageBackoff.Step(losses)
		log.Warn("outbox relay: LISTEN session lost; polling until it is back", "err", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// outage waits out a failure with capped, jittered exponential backoff.
func (r *Relay) outage(ctx context.Context, st *relayState, log *slog.Logger, err error) {
	st.outages++
	wait := r.cfg.OutageBackoff.Delay(st.outages) // jittered: relays that failed together retry apart
	log.Warn("outbox relay: waiting out an outage", "err", err, "retry_in", wait, "failures", st.outages)
	idem.Each(r.cfg.Hooks, func(h OutageHook) { h.OnOutage(err, wait) })
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// dbTimeout bounds every database call of the relay, so that a half-open
// connection cannot stall it.
func (r *Relay) dbTimeout() time.Duration { return max(r.cfg.LeaseTerm/3, time.Second) }

// balance renews the leases held, announces the relay, and takes or gives
// up shards so that each live relay holds its fair share.
func (r *Relay) balance(ctx context.Context, st *relayState) error {
	ctx, cancel := context.WithTimeout(ctx, r.dbTimeout())
	defer cancel()
	start := time.Now()
	term := float64(r.cfg.LeaseTerm.Milliseconds())
	tx, err := r.c.drv.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	s := r.c.s
	if _, err := tx.Exec(ctx, s.presence, st.owner, term); err != nil {
		return fmt.Errorf("announcing the relay: %w", err)
	}
	// Relays that ended without giving their shards up (killed) leave a
	// row; it stops counting after a term and is removed after ten.
	if _, err := tx.Exec(ctx, s.forget, -10*term); err != nil {
		return fmt.Errorf("forgetting relays gone: %w", err)
	}
	held := map[int]lease{}
	scanLeases := func(row inboxdb.Row) error {
		var shard int
		var l lease
		if err := row.Scan(&shard, &l.epoch); err != nil {
			return err
		}
		held[shard] = l
		return nil
	}
	if err := tx.Query(ctx, s.renew, scanLeases, st.owner, term); err != nil {
		return fmt.Errorf("renewing: %w", err)
	}
	var others int
	if err := tx.QueryRow(ctx, s.liveRelays, st.owner).Scan(&others); err != nil {
		return fmt.Errorf("counting the relays: %w", err)
	}
	fair := (st.shards + others) / (others + 1)
	if len(held) < fair {
		if err := tx.Query(ctx, s.claim, scanLeases, st.owner, term, fair-len(held)); err != nil {
			return fmt.Errorf("claiming shards: %w", err)
		}
	}
	var give []int64
	if len(held) > fair {
		mine := make([]int, 0, len(held))
		for shard := range held {
			mine = append(mine, shard)
		}
		slices.Sort(mine)
		for _, shard := range mine[fair:] {
			give = append(give, int64(shard))
			delete(held, shard)
		}
		if _, err := tx.Exec(ctx, s.release, st.owner, s.list(give), s.timeArg(never)); err != nil {
			return fmt.Errorf("giving shards up: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	st.held = held
	st.deadline = start.Add(r.cfg.LeaseTerm * 9 / 10)
	st.renewAt = start.Add(r.cfg.LeaseTerm / 3)
	return nil
}

// stop gives the leases up and removes the relay from the live ones, so
// the others take its shards at once rather than after the lease term.
func (r *Relay) stop(st *relayState, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), r.dbTimeout())
	defer cancel()
	err := func() error {
		tx, err := r.c.drv.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, r.c.s.release, st.owner, r.c.s.list(st.heldShards()), r.c.s.timeArg(never)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, r.c.s.absent, st.owner); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}()
	if err != nil {
		log.Warn("outbox relay: giving the shard leases up failed; other relays take them when they expire", "err", err, "lease_term", r.cfg.LeaseTerm)
	}
}

// row is one outbox row as read, with its shard.
type row struct {
	Record
	shard int
}

// read returns the next batch of the held shards, in seq order. serial
// reads inside a write transaction (SQLite), which waits for an
// enqueuing transaction that just woke the relay to end.
func (r *Relay) read(ctx context.Context, st *relayState, serial bool) ([]row, error) {
	s := r.c.s
	q := s.read
	if r.cfg.StrictOrder {
		q = s.readStrict
	}
	var out []row
	each := func(rw inboxdb.Row) error {
		var x row
		var headers sql.NullString
		var eventTime any
		if err := rw.Scan(&x.Seq, &x.ID, &x.Destination, &x.RoutingKey, &x.Key, &headers, &x.Body, &eventTime, &x.Attempts, &x.shard); err != nil {
			return err
		}
		t, err := s.scanTime(eventTime)
		if err != nil {
			return err
		}
		x.EventTime = t.UTC()
		if headers.Valid {
			if err := json.Unmarshal([]byte(headers.String), &x.Headers); err != nil {
				return fmt.Errorf("row %d: decoding headers: %w", x.Seq, err)
			}
		}
		out = append(out, x)
		return nil
	}
	args := []any{s.list(st.heldShards()), r.cfg.BatchSize}
	if serial {
		tx, err := r.c.drv.BeginMigration(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		return out, tx.Query(ctx, q, each, args...)
	}
	err := r.c.drv.Read(ctx, func(c inboxdb.Conn) error { return c.Query(ctx, q, each, args...) })
	return out, err
}

// pass reads one batch, publishes it and marks what the broker confirmed
// or refused. It returns how many rows it read; an error is an outage (of
// the database or the broker).
func (r *Relay) pass(ctx context.Context, st *relayState, serial bool) (int, error) {
	if len(st.held) == 0 || !time.Now().Before(st.deadline) {
		return 0, nil
	}
	rctx, cancel := context.WithTimeout(ctx, r.dbTimeout())
	rows, err := r.read(rctx, st, serial)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("reading the outbox: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	recs := make([]Record, len(rows))
	for i, x := range rows {
		recs[i] = x.Record
	}
	// The batch in flight is finished even when ctx ends: stopping must
	// not leave a confirmed record unmarked.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	errs := r.pub.Publish(pctx, recs)
	cancel()
	if len(errs) != len(recs) {
		return len(rows), fmt.Errorf("the publisher returned %d results for %d records", len(errs), len(recs))
	}
	var outage error
	var sent, refused []int
	for i, err := range errs {
		switch {
		case err == nil:
			sent = append(sent, i)
		case IsRefused(err):
			refused = append(refused, i)
		case errors.Is(err, ErrNotAttempted):
		default:
			if outage == nil {
				outage = fmt.Errorf("publishing to %q: %w", recs[i].Destination, err)
			}
		}
	}
	if len(sent)+len(refused) > 0 {
		if err := r.mark(ctx, st, rows, errs, sent, refused); err != nil {
			return len(rows), fmt.Errorf("marking published records: %w", err)
		}
	}
	return len(rows), outage
}

// mark records the fates of a published batch in one short transaction
// that first checks the leases are still this relay's; the rows of a
// shard that was lost meanwhile are left for its new holder, who
// republishes them (the downstream consumer skips their IDs).
func (r *Relay) mark(ctx context.Context, st *relayState, rows []row, errs []error, sent, refused []int) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.dbTimeout())
	defer cancel()
	s := r.c.s
	tx, err := r.c.drv.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	valid := map[int]int64{}
	if err := tx.Query(ctx, s.validLeases, func(rw inboxdb.Row) error {
		var shard int
		var epoch int64
		err := rw.Scan(&shard, &epoch)
		valid[shard] = epoch
		return err
	}, st.owner); err != nil {
		return fmt.Errorf("checking the leases: %w", err)
	}
	for shard, l := range st.held {
		if e, ok := valid[shard]; !ok || e != l.epoch {
			delete(st.held, shard)
		}
	}
	kept := func(is []int) []int {
		return slices.DeleteFunc(is, func(i int) bool { _, ok := st.held[rows[i].shard]; return !ok })
	}
	sent, refused = kept(sent), kept(refused)
	seqs := make([]int64, len(sent))
	perDest := map[string]int{}
	for j, i := range sent {
		seqs[j] = rows[i].Seq
		perDest[rows[i].Destination]++
	}
	if len(seqs) > 0 {
		if _, err := tx.Exec(ctx, s.markSent, s.list(seqs)); err != nil {
			return err
		}
	}
	parked := make([]bool, len(refused))
	for j, i := range refused {
		rec := rows[i].Record
		delay := r.cfg.RetryBackoff.Step(rec.Attempts + 1)
		if err := tx.QueryRow(ctx, s.markRefused, rec.Seq, errs[i].Error(), float64(delay.Milliseconds()), r.cfg.MaxAttempts).Scan(&parked[j]); err != nil {
			return err
		}
		if !parked[j] {
			if at := time.Now().Add(delay); st.retryAt.IsZero() || at.Before(st.retryAt) {
				st.retryAt = at
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	r.published.Add(int64(len(seqs)))
	idem.Each(r.cfg.Hooks, func(h PublishHook) {
		for dest, n := range perDest {
			h.OnPublish(dest, n)
		}
	})
	for j, i := range refused {
		rec := rows[i].Record
		if parked[j] {
			r.parked.Add(1)
			r.cfg.Logger.Warn("outbox relay: parked a record the broker refused", "outbox", r.c.table.String(),
				"id", rec.ID, "destination", rec.Destination, "key", rec.Key, "attempts", rec.Attempts+1, "err", errs[i])
		}
		idem.Each(r.cfg.Hooks, func(h RefuseHook) { h.OnRefuse(rec, errs[i], parked[j]) })
	}
	return nil
}
