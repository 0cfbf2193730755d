package idemredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemstore"
)

// ErrNoGroup is wrapped by Run's error when the consumer group is missing
// and Config.GroupStart is empty.
var ErrNoGroup = errors.New("consumer group missing")

// ErrConsumerPending is wrapped by [DeleteConsumer]'s error when the
// consumer still has pending entries.
var ErrConsumerPending = errors.New("consumer has pending entries")

// refusal marks an answer of Redis that no retry changes (a missing group,
// a dead-letter stream missing or of another type): Run refuses to start.
type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// ensureGroup makes sure the group exists, creating it at GroupStart when
// allowed.
func (c *Consumer[TTx]) ensureGroup(ctx context.Context) error {
	groups, err := c.rdb.XInfoGroups(ctx, c.cfg.Stream).Result()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return fmt.Errorf("reading the groups of %s: %w", c.cfg.Stream, err)
	}
	for _, g := range groups {
		if g.Name == c.cfg.Group {
			return nil
		}
	}
	if c.cfg.GroupStart == "" {
		return &refusal{fmt.Errorf("%w: %s has no group %s: create it (XGROUP CREATE %s %s 0 MKSTREAM), or set idemredis.Config.GroupStart",
			ErrNoGroup, c.cfg.Stream, c.cfg.Group, c.cfg.Stream, c.cfg.Group)}
	}
	err = c.rdb.XGroupCreateMkStream(ctx, c.cfg.Stream, c.cfg.Group, c.cfg.GroupStart).Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("creating group %s of %s: %w", c.cfg.Group, c.cfg.Stream, err)
	}
	return nil
}

// ensureDeadLetterStream makes sure the dead-letter stream exists and is a
// stream, creating it (empty) when allowed.
func (c *Consumer[TTx]) ensureDeadLetterStream(ctx context.Context) error {
	dlq := c.cfg.DeadLetterStream
	typ, err := c.rdb.Type(ctx, dlq).Result()
	if err != nil {
		return fmt.Errorf("checking %s: %w", dlq, err)
	}
	switch {
	case typ == "stream":
		return nil
	case typ != "none":
		return &refusal{fmt.Errorf("%w: %s, the dead-letter stream of %s, is a %s", ErrDeadLetterStream, dlq, c.cfg.Stream, typ)}
	case !c.cfg.CreateDeadLetterStream:
		return &refusal{fmt.Errorf("%w: %s, the dead-letter stream of %s, does not exist: create it, or set idemredis.Config.CreateDeadLetterStream",
			ErrDeadLetterStream, dlq, c.cfg.Stream)}
	}
	return CreateStream(ctx, c.rdb, dlq)
}

// checkReplay refuses a stream that holds, or by its declared retention
// (Config.MaxAge) will hold, entries older than the inbox window: group
// reset with XGROUP SETID, or a group restored from a backup, delivers
// them again, and a message older than the window may have lost its
// marker. The age of the oldest entry is read from its ID's milliseconds
// (an ID given by the producer is trusted as a time, as Redis does).
// Nothing is checked when the processor has no horizon (Window <= 0) or
// the caller accepts the replay.
func (c *Consumer[TTx]) checkReplay(ctx context.Context) error {
	window := c.proc.Window()
	if window <= 0 || c.cfg.AcceptReplayPastWindow {
		return nil
	}
	if c.cfg.MaxAge > window {
		return &refusal{fmt.Errorf("%w: stream %s keeps entries for %v (Config.MaxAge), longer than the inbox window of %v: a replay (XGROUP SETID, a restored group) could deliver entries whose markers were pruned; trim to at most the window, lengthen the window, or set idemredis.Config.AcceptReplayPastWindow",
			ErrConfig, c.cfg.Stream, c.cfg.MaxAge, window)}
	}
	first, err := c.rdb.XRangeN(ctx, c.cfg.Stream, "-", "+", 1).Result()
	if err != nil {
		return fmt.Errorf("reading the first entry of %s: %w", c.cfg.Stream, err)
	}
	var age time.Duration
	if len(first) > 0 {
		age = time.Since(entryTime(first[0].ID)).Round(time.Second)
	}
	if age <= window {
		if c.cfg.MaxAge == 0 {
			c.cfg.Logger.Warn("the stream declares no retention (idemredis.Config.MaxAge): once its entries are older than the inbox window, Run refuses to start",
				"consumer", c.consumer, "stream", c.cfg.Stream, "window", window)
		}
		return nil
	}
	return &refusal{fmt.Errorf("%w: stream %s holds entries %v old (first entry %s), older than the inbox window of %v: a replay (XGROUP SETID, a restored group) could deliver entries whose markers were pruned; trim the stream (XTRIM %s MINID <ms>) and declare it in idemredis.Config.MaxAge, lengthen the window, or set idemredis.Config.AcceptReplayPastWindow",
		ErrConfig, c.cfg.Stream, age, first[0].ID, window, c.cfg.Stream)}
}

// CreateStream creates stream empty when it does not exist (a dead-letter
// stream made ahead of its first letter), and leaves an existing one as
// it is.
func CreateStream(ctx context.Context, rdb redis.Cmdable, stream string) error {
	err := createStreamScript.Run(ctx, rdb, []string{stream}).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("creating stream %s: %w", stream, err)
	}
	return nil
}

var createStreamScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local id = redis.call('XADD', KEYS[1], '*', 'idem', 'created')
redis.call('XDEL', KEYS[1], id)
return 1
`)

// deleteConsumerScript deletes a consumer only when it has no pending
// entries: XGROUP DELCONSUMER drops a consumer's pending entries, which
// then no consumer takes over.
var deleteConsumerScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #p > 0 then return redis.error_reply('PENDING consumer ' .. ARGV[2] .. ' has pending entries') end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
`)

// DeleteConsumer removes a consumer of a group (the name of one that is
// gone, left behind in XINFO CONSUMERS) only when it holds no pending
// entry, checked and deleted atomically; otherwise it refuses with an
// error wrapping [ErrConsumerPending]: its entries would be dropped from
// the pending list, never processed. Let them be taken over first (after
// Config.ClaimIdle, by any running consumer of the group).
func DeleteConsumer(ctx context.Context, rdb redis.Cmdable, stream, group, name string) error {
	err := deleteConsumerScript.Run(ctx, rdb, []string{stream}, group, name).Err()
	if err != nil && strings.HasPrefix(err.Error(), "PENDING") {
		return fmt.Errorf("%w: %s of %s/%s: %w", ErrConsumerPending, name, stream, group, err)
	}
	return err
}

// Durability reads what Redis says about whether the entries, acks and
// dead letters it acknowledged survive a crash or a failover, and what the
// stream says about entries trimmed before the group read them, each as a
// risk with its fix. An ack that is lost only makes Redis deliver the
// entry again, and the inbox finds it; an entry or a dead letter lost is
// gone. Run logs each risk as a warning at start; it refuses none
// (asynchronous replication can be a deliberate choice). A Redis that
// refuses CONFIG (a managed service) gives the settings it could read.
func (c *Consumer[TTx]) Durability(ctx context.Context) (idemstore.Durability, error) {
	d := idemstore.Durability{Settings: map[string]string{}}
	if cfg, err := c.rdb.ConfigGet(ctx, "append*").Result(); err == nil {
		for _, k := range []string{"appendonly", "appendfsync"} {
			if v, ok := cfg[k]; ok {
				d.Settings[k] = v
			}
		}
	}
	switch {
	case d.Settings["appendonly"] == "no":
		d.Risks = append(d.Risks, idemstore.DurabilityRisk{
			What: "appendonly is no: a restart loses the entries, dead letters and acks written since the last snapshot",
			Fix:  "appendonly yes with appendfsync always",
		})
	case d.Settings["appendfsync"] != "" && d.Settings["appendfsync"] != "always":
		d.Risks = append(d.Risks, idemstore.DurabilityRisk{
			What: "appendfsync is " + d.Settings["appendfsync"] + ": a crash of the server loses up to a second of entries, dead letters and acks",
			Fix:  "appendfsync always",
		})
	}
	if info, err := c.rdb.Info(ctx, "replication").Result(); err == nil {
		for line := range strings.SplitSeq(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "role" || k == "connected_slaves") {
				d.Settings[k] = v
			}
		}
		if n, _ := strconv.Atoi(d.Settings["connected_slaves"]); n > 0 {
			d.Risks = append(d.Risks, idemstore.DurabilityRisk{
				What: "replication is asynchronous: a replica promoted after a failover misses the last entries and dead letters (acks undone are redelivered and found in the inbox)",
				Fix:  "WAIT after XADD in producers, min-replicas-to-write, and reconcile after a failover",
			})
		}
	}
	st, err := c.rdb.XInfoStream(ctx, c.cfg.Stream).Result()
	if err != nil {
		return d, fmt.Errorf("reading stream %s: %w", c.cfg.Stream, err)
	}
	d.Settings["stream_length"] = strconv.FormatInt(st.Length, 10)
	groups, err := c.rdb.XInfoGroups(ctx, c.cfg.Stream).Result()
	if err != nil {
		return d, fmt.Errorf("reading the groups of %s: %w", c.cfg.Stream, err)
	}
	for _, g := range groups {
		if g.Name != c.cfg.Group {
			continue
		}
		d.Settings["group_pending"] = strconv.FormatInt(g.Pending, 10)
		// XDEL moves max-deleted-entry-id; a trim does not, but leaves the
		// group's lag (entries added and not read) above the length.
		deleted := st.MaxDeletedEntryID != "" && st.MaxDeletedEntryID != "0-0" && compareIDs(st.MaxDeletedEntryID, g.LastDeliveredID) > 0
		if deleted || g.Lag > st.Length {
			d.Risks = append(d.Risks, idemstore.DurabilityRisk{
				What: fmt.Sprintf("entries of %s were deleted or trimmed (XDEL, XTRIM, XADD MAXLEN/MINID) past %s, the last the group %s read (lag %d, length %d): they were never processed",
					c.cfg.Stream, g.LastDeliveredID, c.cfg.Group, g.Lag, st.Length),
				Fix: "trim only below the oldest entry every group has acked (XINFO GROUPS, XPENDING), never by length alone",
			})
		}
	}
	return d, nil
}

// compareIDs orders two entry IDs ("ms-seq").
func compareIDs(a, b string) int {
	pa, pb := splitID(a), splitID(b)
	for i := range pa {
		switch {
		case pa[i] < pb[i]:
			return -1
		case pa[i] > pb[i]:
			return 1
		}
	}
	return 0
}

func splitID(id string) [2]uint64 {
	ms, seq, _ := strings.Cut(id, "-")
	a, _ := strconv.ParseUint(ms, 10, 64)
	b, _ := strconv.ParseUint(seq, 10, 64)
	return [2]uint64{a, b}
}
