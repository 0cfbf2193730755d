package pooltest

import "time"

// SetStuck shortens Stuck for this package's own test.
func SetStuck(d time.Duration) { stuck = d }
