package idemrabbitmq

import (
	"github.com/idemkit/idem/idembroker"
)

// Health reports the consumer's state for probes and status pages
// ([idembroker.HandleHealth]): whether Run runs, whether its consuming channel
// is open, whether it holds deliveries because the inbox database is
// unreachable (since when and why), when a delivery was last settled, the
// last error, the reconnects so far and the deliveries received and not
// yet settled (at most Config.Prefetch). It reads what the consumer
// recorded as it went and asks neither the broker nor the database.
func (c *Consumer[TTx]) Health() idembroker.Health {
	h := c.health.Health()
	h.Reconnects = c.stats.reconnects.Load()
	h.InFlight = int(c.inFlight.Load())
	return h
}
