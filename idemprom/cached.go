package idemprom

import (
	"context"
	"sync"
	"time"
)

// snapshot is one read of a collector's figures from the database.
type snapshot[T any] struct {
	val  T
	err  error
	took time.Duration
}

// cachedRead reads a collector's figures on scrape: one read serves the
// scrapes of an interval, concurrent scrapes share one read, and a scrape
// waits for it at most its timeout, so a database that does not answer
// costs a scrape a bounded wait and an error, never a hang.
type cachedRead[T any] struct {
	read     func(context.Context) (T, error)
	interval time.Duration // <0: every scrape reads
	timeout  time.Duration

	mu       sync.Mutex
	last     snapshot[T]
	at       time.Time     // when last was read; zero: never
	inflight chan struct{} // closed when the running read ends; nil: none
	errors   float64       // reads that failed or timed out
}

// get returns the current figures, reading them when they are stale.
func (c *cachedRead[T]) get() snapshot[T] {
	c.mu.Lock()
	if !c.at.IsZero() && c.interval > 0 && time.Since(c.at) < c.interval {
		defer c.mu.Unlock()
		return c.last
	}
	if c.inflight == nil {
		c.inflight = make(chan struct{})
		go c.refresh(c.inflight)
	}
	done := c.inflight
	c.mu.Unlock()

	// The read itself is bounded by timeout; this bound only matters for a
	// store that ignores its context, which must not hold the scrape.
	t := time.NewTimer(c.timeout + time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return snapshot[T]{err: context.DeadlineExceeded, took: c.timeout}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// refresh reads once, with the timeout, and publishes the result.
func (c *cachedRead[T]) refresh(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	start := time.Now()
	v, err := c.read(ctx)
	r := snapshot[T]{val: v, err: err, took: time.Since(start)}
	c.mu.Lock()
	c.last, c.at, c.inflight = r, time.Now(), nil
	if err != nil {
		c.errors++
	}
	c.mu.Unlock()
	close(done)
}

// failures returns how many reads failed or timed out.
func (c *cachedRead[T]) failures() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errors
}

// lastErr returns the error of the last read, nil when it succeeded or
// none ran yet.
func (c *cachedRead[T]) lastErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.err
}
