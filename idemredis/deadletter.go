package idemredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// ErrDeadLetterStream is wrapped by Run's error when the dead-letter
// stream is missing and may not be created, or is no stream; and by a
// dead letter's error while it is missing.
var ErrDeadLetterStream = errors.New("dead-letter stream not usable")

// deadLetterScript copies an entry to the dead-letter stream and acks it,
// atomically: Redis runs a script alone, and writes its effects to the
// append-only file and to replicas as one transaction, so a crash leaves
// both or neither. It does nothing for an entry no longer pending (another
// consumer settled it) and writes nothing when the dead-letter stream is
// missing or is no stream (XADD fails before XACK runs). Run again after
// its reply was lost, it finds the entry acked and writes nothing: a retry
// never doubles a letter.
//
// KEYS: the stream, the dead-letter stream. ARGV: the group, the entry ID,
// then the dead letter's fields and values.
var deadLetterScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('NODLQ the dead-letter stream ' .. KEYS[2] .. ' does not exist')
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
`)

// deadLetterFields are the fields of e's dead letter: its own (the ID,
// body and trace context with them; the envelope of an earlier dead letter
// dropped, its redrive count kept), then its idembroker.Envelope (why,
// who, how often, where from) and the delivery counter.
func (c *Consumer[TTx]) deadLetterFields(e Entry, res idem.Result) []any {
	args := make([]any, 0, 2*len(e.Fields)+2*len(idembroker.EnvelopeHeaders)+2)
	for k, v := range e.Fields {
		if strings.HasPrefix(k, "x-idem-") && k != FieldRedriven {
			continue
		}
		args = append(args, k, v)
	}
	env := idembroker.NewEnvelope(c.consumer, e.origin(), res, res.Disposition)
	env.Write(
		func(k, v string) { args = append(args, k, v) },
		func(k string, n int64) { args = append(args, k, strconv.FormatInt(n, 10)) })
	return append(args, FieldDeliveries, strconv.FormatInt(e.Deliveries, 10))
}

// deadLetter runs the dead-letter script for e until it is applied or ctx
// ends, and reports whether e is done with (dead-lettered now, or settled
// by another consumer before). Moving past an entry that is in neither
// the database nor the dead-letter stream would lose it, so a stream that
// is missing holds the consumer here.
func (c *Consumer[TTx]) deadLetter(ctx context.Context, e Entry, res idem.Result) (written bool, err error) {
	args := append([]any{c.cfg.Group, e.ID}, c.deadLetterFields(e, res)...)
	for try := 1; ; try++ {
		n, err := deadLetterScript.Run(ctx, c.rdb, []string{c.cfg.Stream, c.cfg.DeadLetterStream}, args...).Int()
		if err != nil && strings.HasPrefix(err.Error(), "NODLQ") {
			err = fmt.Errorf("%w: %w", ErrDeadLetterStream, err)
		}
		if err == nil && n == 0 {
			c.cfg.Logger.Info("entry no longer pending when dead-lettered: another consumer settled it",
				"consumer", c.consumer, "origin", e.origin(), "message_id", res.MessageID)
			return false, nil
		}
		c.deadLettered(e, c.cfg.DeadLetterStream, res, err)
		if err == nil {
			c.cfg.Logger.Debug("dead letter written", "consumer", c.consumer, "origin", e.origin(),
				"message_id", res.MessageID, "dead_letter_stream", c.cfg.DeadLetterStream)
			return true, nil
		}
		c.health.Fail(fmt.Errorf("dead letter of %s: %w", e.origin(), err), now())
		c.cfg.Logger.Error("writing dead letter failed; the entry stays pending and the stream waits",
			"consumer", c.consumer, "origin", e.origin(), "dead_letter_stream", c.cfg.DeadLetterStream, "error", err)
		if err := sleep(ctx, c.cfg.Backoff.Delay(try)); err != nil {
			return false, err
		}
	}
}
