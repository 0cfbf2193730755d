package idemredis_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/adaptertest"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/redistest"
)

// The adapter conformance suite against the shared Redis: every check
// every broker adapter passes, the pool-of-one runs included.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, &conformanceHarness{admin: redistest.Client(t)})
}

// conformanceHarness gives the suite streams under a key prefix of the
// check's own, each with its group and its dead-letter stream, and
// consumers whose Redis connections go through a netfault proxy.
type conformanceHarness struct {
	admin *redis.Client
}

func (h *conformanceHarness) Features() adaptertest.Features {
	return adaptertest.Features{
		// One consumer of a stream applies it in order.
		Ordered:                    true,
		ErrNoDeadLetterDestination: idemredis.ErrDeadLetterStream,
		StopWithin:                 5 * time.Second,
	}
}

const conformanceGroup = "conformance"

func (h *conformanceHarness) Topic(t testing.TB) string {
	t.Helper()
	stream := redistest.Prefix(t, h.admin) + "stream"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.admin.XGroupCreateMkStream(ctx, stream, conformanceGroup, "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := idemredis.CreateStream(ctx, h.admin, stream+".dlq"); err != nil {
		t.Fatal(err)
	}
	return stream
}

func (h *conformanceHarness) Publish(t testing.TB, stream string, msgs ...adaptertest.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range msgs {
		values := []any{idemredis.DefaultBodyField, m.Body}
		if m.ID != "" {
			values = append(values, idemredis.DefaultIDField, m.ID)
		}
		if !m.EventTime.IsZero() {
			values = append(values, idemredis.DefaultTimeField, m.EventTime.UTC().Format(time.RFC3339Nano))
		}
		if err := h.admin.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err(); err != nil {
			t.Fatalf("XADD to %s: %v", stream, err)
		}
	}
}

// conformanceConsumer is a Consumer whose Redis connections go through a
// netfault proxy, so that the suite can cut them.
type conformanceConsumer struct {
	*idemredis.Consumer[pgx.Tx]
	proxy *netfault.Proxy
}

func (c conformanceConsumer) Cut() bool {
	c.proxy.Cut()
	return true
}

func (h *conformanceHarness) Consumer(t testing.TB, stream string, proc *idem.Processor[pgx.Tx], opts adaptertest.ConsumerOptions) adaptertest.Consumer {
	t.Helper()
	c := conformanceConsumer{proxy: netfault.New(t, redistest.Addr())}
	rdb := redis.NewClient(&redis.Options{Addr: c.proxy.Addr(), DialTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	cfg := &idemredis.Config{
		Stream:    stream,
		Group:     conformanceGroup,
		BatchSize: opts.BatchSize,
		Block:     200 * time.Millisecond,
		ClaimIdle: 500 * time.Millisecond,
		Backoff:   idem.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:    opts.Logger,
	}
	if opts.NoDeadLetterDestination {
		cfg.DeadLetterStream = stream + ".no-such-dlq"
	}
	if opts.CrashBeforeAck {
		var once sync.Once
		cfg.Faults = func(context.Context, idem.FaultPoint, string, []string) (err error) {
			once.Do(func() { err = errors.New("process died between commit and XACK") })
			return err
		}
	}
	var err error
	c.Consumer, err = idemredis.New(rdb, proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (h *conformanceHarness) DeadLetters(t testing.TB, stream string) []adaptertest.DeadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := h.admin.XRange(ctx, stream+".dlq", "-", "+").Result()
	if err != nil {
		t.Fatalf("XRANGE %s.dlq: %v", stream, err)
	}
	out := make([]adaptertest.DeadLetter, 0, len(msgs))
	for _, m := range msgs {
		dl := adaptertest.DeadLetter{Headers: map[string]string{}}
		for k, v := range m.Values {
			dl.Headers[k], _ = v.(string)
		}
		dl.ID = dl.Headers[idemredis.DefaultIDField]
		dl.Body = []byte(dl.Headers[idemredis.DefaultBodyField])
		out = append(out, dl)
	}
	return out
}

func (h *conformanceHarness) DropDeadLetters(t testing.TB, stream string) {
	t.Helper()
	if err := h.admin.Del(context.Background(), stream+".dlq").Err(); err != nil {
		t.Fatal(err)
	}
}

func (h *conformanceHarness) RestoreDeadLetters(t testing.TB, stream string) {
	t.Helper()
	if err := idemredis.CreateStream(context.Background(), h.admin, stream+".dlq"); err != nil {
		t.Fatal(err)
	}
}
