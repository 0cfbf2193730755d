package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// A message whose adapter could not read its event-time header
// (Message.TimeErr) is bad input on every broker: the processor
// dead-letters it with ErrBadTime and the header's error, alone in its
// batch, without running the handler for it; Predict says the same.
func TestBadEventTimeIsDeadLettered(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	handled := map[string]bool{}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "badtime",
		Key:      idem.ByMessageID,
		Handler: func(_ context.Context, _ pgx.Tx, m idem.Message) error {
			handled[m.ID] = true
			return nil
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cause := errors.New(`header x-event-time: parsing "yesterday" as RFC 3339 or Unix milliseconds`)
	bad := idem.Message{ID: "bad-" + now.Format("150405.000000000"), Body: []byte("x"), Time: now, TimeSource: idem.TimeFromBroker, TimeErr: cause}
	good := idem.Message{ID: "good-" + now.Format("150405.000000000"), Body: []byte("y"), Time: now, TimeSource: idem.TimeFromBroker}
	if p, err := proc.Predict(ctx, bad); err != nil || p.Outcome != idem.DeadLettered {
		t.Errorf("Predict = %+v, %v; want DeadLettered", p, err)
	}
	rs := proc.ProcessBatch(ctx, []idem.Message{bad, good})
	if rs[0].Outcome != idem.DeadLettered || !errors.Is(rs[0].Err, idem.ErrBadTime) || !errors.Is(rs[0].Err, cause) {
		t.Errorf("bad time: %v %v; want DeadLettered wrapping ErrBadTime and the header's error", rs[0].Outcome, rs[0].Err)
	}
	if rs[1].Outcome != idem.Applied {
		t.Errorf("good message: %v %v; want Applied", rs[1].Outcome, rs[1].Err)
	}
	if handled[bad.ID] || !handled[good.ID] {
		t.Errorf("handled %v; want the good message alone", handled)
	}
	if d := proc.Dispose(rs[0]); d.Action != idem.ActionDeadLetter {
		t.Errorf("disposition %v; want dead letter", d.Action)
	}
}
