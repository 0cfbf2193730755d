package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
	"github.com/idemkit/idem/idemredis"
)

// DefaultRedisURL is the Redis server when RedisConfig names none.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

// RedisConfig names a Redis dead-letter stream.
type RedisConfig struct {
	// URL is the server ("redis://[:password@]host:port/db", rediss:// for
	// TLS). Defaults to [DefaultRedisURL]. Ignored when Client is set.
	URL string
	// Client is a client of the caller's (a cluster client, say); the
	// source then uses it and Close leaves it open.
	Client redis.UniversalClient
	// Stream is the dead-letter stream ("billing.dlq"). Required.
	Stream string
	// IDField is the field with the message ID (idemredis.Config.IDField).
	// Defaults to "idem-message-id".
	IDField string
	// TimeField is the producers' event-time field
	// (idemredis.Config.TimeField). Defaults to "x-event-time".
	TimeField string
	// BodyField and KeyField are the payload's and the routing key's
	// fields. Default to "body" and "key".
	BodyField, KeyField string
	// Target is the stream letters that name no origin are redriven to.
	// Empty: such letters are refused.
	Target string
}

// Redis is a dead-letter stream of Redis, as idemredis fills it: each
// letter is an entry with the original entry's fields and the
// idembroker.Envelope. Reading is XRANGE, which changes nothing (no group,
// no pending list, no delivery counted). A redrive copies a letter to its
// origin stream and deletes it from the dead-letter stream in one Lua
// script, atomic on the server, after checking that the letter is still
// there: a crash leaves it in one place, and two redrives of one letter
// at once send it once. On a Redis Cluster the two streams must share a
// slot, as the consumer already requires ({billing}, {billing}.dlq).
type Redis struct {
	cfg RedisConfig
	rdb redis.UniversalClient
	own bool
}

// NewRedis connects to the server and checks that the stream exists and is
// a stream.
func NewRedis(ctx context.Context, cfg RedisConfig) (*Redis, error) {
	if cfg.Stream == "" {
		return nil, errors.New("dlq: Redis needs a stream")
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&cfg.URL, DefaultRedisURL)
	def(&cfg.IDField, idemredis.DefaultIDField)
	def(&cfg.TimeField, idemredis.DefaultTimeField)
	def(&cfg.BodyField, idemredis.DefaultBodyField)
	def(&cfg.KeyField, idemredis.DefaultKeyField)
	r := &Redis{cfg: cfg, rdb: cfg.Client}
	if r.rdb == nil {
		opt, err := redis.ParseURL(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("dlq: Redis URL %s: %w", idembroker.RedactURL(cfg.URL), idembroker.RedactError(err, cfg.URL))
		}
		r.rdb, r.own = redis.NewClient(opt), true
	}
	typ, err := r.rdb.Type(ctx, cfg.Stream).Result()
	switch {
	case err != nil:
		err = fmt.Errorf("dead-letter stream %s: %w", cfg.Stream, idembroker.RedactError(err, cfg.URL))
	case typ == "none":
		err = fmt.Errorf("dead-letter stream %s: no such stream", cfg.Stream)
	case typ != "stream":
		err = fmt.Errorf("dead-letter stream %s: is a %s, not a stream", cfg.Stream, typ)
	}
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// Name says which stream.
func (r *Redis) Name() string { return "redis stream " + r.cfg.Stream }

// Close closes the client the source made.
func (r *Redis) Close() error {
	if r.own {
		return r.rdb.Close()
	}
	return nil
}

// entries reads the letters, oldest first (at most limit; 0: all).
func (r *Redis) entries(ctx context.Context, limit int) ([]redis.XMessage, error) {
	var (
		ms  []redis.XMessage
		err error
	)
	if limit > 0 {
		ms, err = r.rdb.XRangeN(ctx, r.cfg.Stream, "-", "+", int64(limit)).Result()
	} else {
		ms, err = r.rdb.XRange(ctx, r.cfg.Stream, "-", "+").Result()
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", r.cfg.Stream, err)
	}
	return ms, nil
}

// fields are an entry's fields as strings.
func fields(m redis.XMessage) map[string]string {
	h := make(map[string]string, len(m.Values))
	for k, v := range m.Values {
		if s, ok := v.(string); ok {
			h[k] = s
		} else {
			h[k] = fmt.Sprint(v)
		}
	}
	return h
}

// entryTime is the time in an entry ID's milliseconds; zero for anything
// else.
func entryTime(id string) time.Time {
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		return time.Time{}
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n)
}

// letter reads an entry of the stream. Its headers are the fields but the
// body, as the consumer hands them over (idem.Message.Headers); its
// broker time is the original entry's, from its origin.
func (r *Redis) letter(m redis.XMessage) Letter {
	f := fields(m)
	id := f[r.cfg.IDField]
	e := idembroker.ReadEnvelope(f)
	l := Letter{
		ID: id, DLQ: r.cfg.Stream, Position: m.ID,
		Reason: e.Reason, Outcome: e.Outcome, Consumer: e.Consumer, Attempts: e.Attempts,
		Origin: e.Origin, Redriven: e.Redriven,
		Key: f[r.cfg.KeyField], Body: []byte(f[r.cfg.BodyField]),
	}
	delete(f, r.cfg.BodyField)
	l.Headers = f
	if l.Reason == "" {
		l.Reason = "unknown"
	}
	// stream/entry-ID; an entry ID has no slash.
	var at time.Time
	if i := strings.LastIndexByte(l.Origin, '/'); i > 0 {
		l.Target, at = l.Origin[:i], entryTime(l.Origin[i+1:])
	}
	if l.Target == "" {
		l.Target = r.cfg.Target
	}
	var field time.Time
	if v, ok := f[r.cfg.TimeField]; ok {
		field, _ = idembroker.ParseEventTime(v)
	}
	l.Time, l.TimeSource = idem.EventTime(id, field, at)
	l.TimeFrom = l.TimeSource.String()
	return l
}

// Peek reads the letters (at most limit; 0: all) with XRANGE, leaving
// them as they are.
func (r *Redis) Peek(ctx context.Context, limit int) ([]Letter, error) {
	ms, err := r.entries(ctx, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Letter, 0, len(ms))
	for _, m := range ms {
		out = append(out, r.letter(m))
	}
	return out, nil
}

// redriveScript copies a letter to its target stream and deletes it from
// the dead-letter stream, atomically; it does nothing for a letter no
// longer there (settled by another redrive or purge) and refuses a target
// stream that does not exist (its consumers' group would be missing too).
//
// KEYS: the dead-letter stream, the target. ARGV: the letter's entry ID,
// then the redriven entry's fields and values.
var redriveScript = redis.NewScript(`
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('NOTARGET the stream ' .. KEYS[2] .. ' does not exist')
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
`)

// redriven is the fields of l's redrive: the entry's own, minus the
// dead-letter fields, plus the redrive count, and the event time of the
// original entry when the producer gave none (the redriven entry's ID is
// new, and its time would otherwise be the redrive's).
func (r *Redis) redriven(m redis.XMessage, l *Letter) []any {
	args := []any{m.ID}
	hasTime := false
	for k, v := range fields(m) {
		if deadLetterHeader(k) || k == idemredis.FieldDeliveries {
			continue
		}
		hasTime = hasTime || k == r.cfg.TimeField
		args = append(args, k, v)
	}
	if !hasTime && l.TimeSource == idem.TimeFromBroker {
		args = append(args, r.cfg.TimeField, strconv.FormatInt(l.Time.UnixMilli(), 10))
	}
	return append(args, idembroker.HeaderRedriven, strconv.Itoa(l.Redriven+1))
}

// Walk hands the letters (at most limit; 0: all), oldest first, to decide.
// A Send is copied to its target stream and deleted from the dead-letter
// stream in one atomic script; a Drop is deleted (XDEL).
func (r *Redis) Walk(ctx context.Context, limit int, decide func(*Letter) (Action, error), done func(*Letter, Action, bool)) error {
	ms, err := r.entries(ctx, limit)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := ctx.Err(); err != nil {
			return err
		}
		l := r.letter(m)
		act, err := decide(&l)
		if err != nil {
			return err
		}
		switch act {
		case Send:
			if l.Target == "" {
				return fmt.Errorf("letter %q names no origin stream to redrive to", l.ID)
			}
			n, err := redriveScript.Run(ctx, r.rdb, []string{r.cfg.Stream, l.Target}, r.redriven(m, &l)...).Int()
			if err != nil {
				return fmt.Errorf("redriving %q to %s: %w", l.ID, l.Target, err)
			}
			if n == 1 {
				report(done, &l, act, true)
			}
		case Drop:
			n, err := r.rdb.XDel(ctx, r.cfg.Stream, m.ID).Result()
			if err != nil {
				return fmt.Errorf("deleting %q from %s: %w", l.ID, r.cfg.Stream, err)
			}
			report(done, &l, act, n == 1)
		}
	}
	return nil
}
