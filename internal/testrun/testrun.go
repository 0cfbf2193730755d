// Package testrun runs a long-lived Run(ctx) loop (a broker consumer) in the
// background of a test and stops it on demand or when the test ends.
package testrun

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Runner is anything with a blocking Run, such as a broker consumer.
type Runner interface {
	Run(ctx context.Context) error
}

// Start runs r in the background and returns a stop function that cancels
// it and returns Run's error once Run returned, or an error if it did not
// return within grace. stop is idempotent and also runs when t ends.
func Start(t testing.TB, r Runner, grace time.Duration) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(grace):
				err = fmt.Errorf("the Run method did not return within %v of cancel", grace)
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}
