package outbox

import "context"

// Table is the outbox table's name, as configured.
func (o *Outbox[TTx]) Table() string { return o.tableName() }

// Migrate creates the outbox table and its siblings (<table>_leases,
// <table>_relays, <table>_meta), or brings them to the newest schema
// version, in one transaction serialized against other migrators; running
// it again is a no-op. A new table stores Config.Shards (DefaultShards
// when 0); an existing one keeps its count, and a different non-zero
// Config.Shards is refused.
func (o *Outbox[TTx]) Migrate(ctx context.Context) (MigrateReport, error) {
	return o.migrateReport(ctx)
}

// Stats counts the outbox's rows per destination: unsent, the oldest
// unsent row's age (the relays' lag), parked and sent. It reads the whole
// table: for a dashboard every few seconds, not for every message.
func (o *Outbox[TTx]) Stats(ctx context.Context) (Stats, error) { return o.stats(ctx) }

// Prune deletes the rows sent longer than the retention ago (7 days by
// default), in batches each its own short transaction, and returns how
// many it deleted (with DryRun, would delete). Unsent and parked rows are
// never deleted.
func (o *Outbox[TTx]) Prune(ctx context.Context, opts PruneOptions) (int64, error) {
	return o.prune(ctx, opts)
}

// Retry un-parks the parked rows that match f: their attempts start again
// from zero and the relays send them on their next pass (notified on
// PostgreSQL). It returns how many rows it un-parked. Without
// RelayConfig.StrictOrder, a retried row is published after the later rows
// of its key that flowed past it while it was parked.
func (o *Outbox[TTx]) Retry(ctx context.Context, f RetryFilter) (int64, error) {
	return o.retry(ctx, f)
}

// ParkedRows lists up to limit parked rows, oldest first, with the reason
// the broker gave.
func (o *Outbox[TTx]) ParkedRows(ctx context.Context, limit int) ([]ParkedRow, error) {
	return o.parkedRows(ctx, limit)
}

// SentRows lists the rows the broker confirmed that f selects, oldest
// sequence first, with their payload as the relay published it: what a
// reconciliation (package reconcile) checks each consumer for, and
// redelivers from.
func (o *Outbox[TTx]) SentRows(ctx context.Context, f SentFilter) ([]Record, error) {
	return o.sentRows(ctx, f)
}
