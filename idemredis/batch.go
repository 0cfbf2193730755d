package idemredis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// handle applies entries, in stream order, in batches of BatchSize, acks
// each batch's done entries after its commit, and runs an entry the
// processor handed back (Leave) again alone after the disposition's delay.
//
// Invariant, at the top of each turn: entries[0] is the first entry not
// settled; every entry before it was acked (or its XACK failed, was
// logged, and it will be taken over and found in the inbox), or is in the
// dead-letter stream. Only entries[0] is ever run again. While handle
// runs, a keeper holds every entry not yet settled from going idle, so
// that no other consumer takes it over. handle returns when every entry is
// settled, or, leaving the rest pending, when ctx ends or the consumer
// crashed.
func (c *Consumer[TTx]) handle(ctx context.Context, entries []Entry) {
	c.inFlight.Store(int64(len(entries)))
	defer c.inFlight.Store(0)
	keep := c.keep(ctx, entries)
	defer keep.stop()
	runs := 0
	for len(entries) > 0 {
		if ctx.Err() != nil || c.crashing() {
			return
		}
		n := min(len(entries), c.cfg.BatchSize)
		if runs > 0 {
			n = 1
		}
		batch := entries[:n]
		results := c.process(ctx, batch, runs)
		s := c.settle(ctx, batch, results)
		if s.n > 0 {
			runs = 0
		}
		entries = entries[s.n:]
		keep.from(s.n)
		c.inFlight.Store(int64(len(entries)))
		switch {
		case s.halt:
			return
		case s.retry:
			c.set.Settle(c.cfg.Stream, s.d, s.res, now())
			runs++
			if sleep(ctx, s.delay) != nil {
				return
			}
		}
	}
}

// settled is what a batch's settlement came to: its first n entries are
// done with; then either all are, or the next one is to be run again after
// delay (d and res its disposition and result), or the consumer must stop
// (halt: ctx ended, or it crashed).
type settled struct {
	n     int
	retry bool
	delay time.Duration
	d     idem.Disposition
	res   idem.Result
	halt  bool
}

// settle carries out the processor's dispositions of a batch, in order,
// through [VerbFor], and stops at the first entry left pending. The acks
// are one XACK, sent after the batch's commit, and reported once Redis
// answered.
func (c *Consumer[TTx]) settle(ctx context.Context, batch []Entry, results []idem.Result) settled {
	type done struct {
		d   idem.Disposition
		res idem.Result
	}
	var acks []string
	var acked []done
	flush := func() bool {
		if len(acks) == 0 {
			return true
		}
		if !c.ackAfterCommit(ctx, acks) {
			return !c.crashing()
		}
		for _, a := range acked {
			if a.res.Outcome == idem.Duplicate {
				c.stats.duplicates.Add(1)
			} else {
				c.stats.applied.Add(1)
			}
			c.set.Settle(c.cfg.Stream, a.d, a.res, now())
		}
		return true
	}
	for i, res := range results {
		d := res.Disposition
		switch VerbFor(d.Action) {
		case Ack:
			acks = append(acks, batch[i].ID)
			acked = append(acked, done{d, res})
		case DeadLetter:
			written, err := c.deadLetter(ctx, batch[i], res)
			if err != nil {
				flush()
				return settled{n: i, halt: true}
			}
			if written {
				c.stats.deadLettered.Add(1)
				c.set.Settle(c.cfg.Stream, d, res, now())
			}
		default: // Leave
			if !flush() {
				return settled{n: i, halt: true}
			}
			if d.Action == idem.ActionRedeliver {
				c.stats.retried.Add(1)
			} else {
				c.stats.held.Add(1)
			}
			delay := d.Delay
			if delay <= 0 {
				delay = c.cfg.Backoff.Initial
			}
			return settled{n: i, retry: true, delay: delay, d: d, res: res}
		}
	}
	if !flush() {
		return settled{n: len(results), halt: true}
	}
	return settled{n: len(results)}
}

// ackAfterCommit passes the fault point, then acks ids. It reports false
// when the consumer crashed at the fault point or the XACK failed.
func (c *Consumer[TTx]) ackAfterCommit(ctx context.Context, ids []string) bool {
	if c.cfg.Faults != nil {
		if err := c.cfg.Faults(ctx, BeforeAck, c.cfg.Stream, ids); err != nil {
			c.crash(fmt.Errorf("fault at %s: %w", BeforeAck, err))
			return false
		}
	}
	if c.crashing() {
		return false
	}
	return c.ack(ctx, ids)
}

// ack sends one XACK of ids, trying again while Redis is away until it
// answers or AckTimeout after ctx ended (the acks at shutdown matter
// most). An XACK that failed leaves the entries pending: whoever takes
// them over finds their markers.
func (c *Consumer[TTx]) ack(ctx context.Context, ids []string) bool {
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.AckTimeout, cancel) })()
	for try := 1; ; try++ {
		err := c.rdb.XAck(actx, c.cfg.Stream, c.cfg.Group, ids...).Err()
		c.acked(c.cfg.Stream, ids, err)
		if err == nil {
			c.stats.acks.Add(1)
			return true
		}
		c.stats.ackErrors.Add(1)
		c.health.Disconnect(fmt.Errorf("XACK of %d entries: %w", len(ids), err), now())
		c.cfg.Logger.Warn("XACK failed; trying again (the entries stay pending meanwhile)", "consumer", c.consumer, "stream", c.cfg.Stream, "entries", len(ids), "error", err)
		if sleep(actx, c.cfg.Backoff.Delay(try)) != nil {
			c.cfg.Logger.Warn("XACK given up; the entries stay pending, to be taken over and found in the inbox", "consumer", c.consumer, "stream", c.cfg.Stream, "entries", len(ids))
			return false
		}
	}
}

// process runs one batch through the processor, in order. runs is how
// often the first entry ran before. Every entry goes to the processor, one
// without an ID or with a bad event time included: it decides.
func (c *Consumer[TTx]) process(ctx context.Context, batch []Entry, runs int) []idem.Result {
	msgs := make([]idem.Message, len(batch))
	noIDs := make(map[int]error)
	for i, e := range batch {
		r := 0
		if i == 0 {
			r = runs
		}
		m, noID := c.cfg.message(e, r)
		if noID != nil {
			noIDs[i] = noID
		}
		msgs[i] = m
	}
	c.stats.delivered.Add(uint64(len(batch)))
	busy := c.health.Begin(now())
	defer func() { c.health.End(busy, now()) }()
	results := c.proc.ProcessBatchInOrder(ctx, msgs)
	for i, r := range results {
		if noID := noIDs[i]; noID != nil && r.Outcome == idem.DeadLettered && errors.Is(r.Err, idem.ErrNoMessageID) {
			results[i].Err = noID
			results[i].Disposition = c.proc.Dispose(results[i])
		}
	}
	return results
}

// keeper keeps the entries in hand from going idle: every ClaimIdle/3 it
// claims those idle for that long again for this consumer (XCLAIM JUSTID:
// the idle time restarts, the delivery counter does not move), so that no
// other consumer takes over an entry whose transaction or retry is under
// way. An entry another consumer took over meanwhile (this one stalled
// past ClaimIdle) and that is not idle is left to it.
type keeper struct {
	mu   sync.Mutex
	ids  []string
	quit chan struct{}
	done chan struct{}
}

func (c *Consumer[TTx]) keep(ctx context.Context, entries []Entry) *keeper {
	k := &keeper{quit: make(chan struct{}), done: make(chan struct{})}
	for _, e := range entries {
		k.ids = append(k.ids, e.ID)
	}
	every := c.cfg.ClaimIdle / 3
	go func() {
		defer close(k.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-k.quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			k.mu.Lock()
			ids := append([]string(nil), k.ids...)
			k.mu.Unlock()
			if len(ids) == 0 {
				continue
			}
			err := c.rdb.XClaimJustID(ctx, &redis.XClaimArgs{
				Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Name, MinIdle: every, Messages: ids,
			}).Err()
			if err != nil && ctx.Err() == nil {
				c.cfg.Logger.Debug("keeping entries from going idle failed", "consumer", c.consumer, "error", err)
			}
		}
	}()
	return k
}

// from drops the first n entries, settled.
func (k *keeper) from(n int) {
	k.mu.Lock()
	k.ids = k.ids[n:]
	k.mu.Unlock()
}

func (k *keeper) stop() {
	close(k.quit)
	<-k.done
}
