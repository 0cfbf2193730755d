package idembroker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idembroker"
)

// brokerEvents implements every broker hook and records what it heard.
type brokerEvents struct{ got []string }

func (b *brokerEvents) OnSettle(consumer, source string, d idem.Disposition, _ idem.Result) {
	b.got = append(b.got, "settle "+consumer+" "+source+" "+d.Action.String())
}

func (b *brokerEvents) OnDeadLetter(consumer, destination string, _ idem.Result, err error) {
	b.got = append(b.got, "dead letter "+consumer+" "+destination+" "+errText(err))
}

func (b *brokerEvents) OnRedelivered(consumer, source string) {
	b.got = append(b.got, "redelivered "+consumer+" "+source)
}

func (b *brokerEvents) OnReconnect(consumer, source string, err error) {
	b.got = append(b.got, "reconnect "+consumer+" "+source+" "+errText(err))
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// settleOnly implements one hook: the others are not called on it.
type settleOnly struct{ n int }

func (s *settleOnly) OnSettle(string, string, idem.Disposition, idem.Result) { s.n++ }

// The settle step is the whole step for each event: the health records a
// settlement, and every hook implementing the event's interface hears of
// it, in the order of the list, with the consumer's name.
func TestSettlerCallsEachHookForItsEvents(t *testing.T) {
	all, one := &brokerEvents{}, &settleOnly{}
	s := idembroker.NewSettler("billing", "invoices", []idem.Hook{all, one, "not a hook"}, nil)
	now := time.Now()
	s.Health().Start(now)
	s.Health().Connect(now)
	s.Redelivered("invoices")
	s.Settle("invoices", idem.Disposition{Action: idem.ActionAck}, idem.Result{MessageID: "m1", Outcome: idem.Applied}, now)
	s.DeadLetter("invoices.dlq", idem.Result{MessageID: "m2", Outcome: idem.DeadLettered}, errors.New("nacked"))
	s.Reconnect("invoices", errors.New("connection reset"))
	want := []string{
		"redelivered billing invoices",
		"settle billing invoices ack",
		"dead letter billing invoices.dlq nacked",
		"reconnect billing invoices connection reset",
	}
	if len(all.got) != len(want) {
		t.Fatalf("heard %q; want %q", all.got, want)
	}
	for i := range want {
		if all.got[i] != want[i] {
			t.Errorf("event %d: %q; want %q", i, all.got[i], want[i])
		}
	}
	if one.n != 1 {
		t.Errorf("the settle-only hook heard %d settlements; want 1", one.n)
	}
	if h := s.Health().Health(); !h.LastSuccess.Equal(now) || h.Consumer != "billing" || h.Source != "invoices" {
		t.Errorf("health %+v; want the ack recorded as the last success", h)
	}
}
