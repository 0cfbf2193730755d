package outbox

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// Validation never panics, refuses with ErrInvalid only, and what it
// accepts is what a broker can carry: a destination (or the default
// exchange with a routing key), bounded valid names, a bounded body.
func FuzzMessageValidate(f *testing.F) {
	f.Add("billing.invoices", "", "c1", "content-type", "application/json", []byte(`{}`), false)
	f.Add("", "invoices", "", "", "", []byte("x"), true)
	f.Add("", "", "", "bad name", "v", []byte(nil), false)
	f.Add("t", "", "\xff", "k", "\x00", []byte("123456789"), false)
	f.Fuzz(func(t *testing.T, dest, routing, key, hname, hvalue string, body []byte, def bool) {
		m := Message{Destination: dest, RoutingKey: routing, Key: key, Body: body, DefaultExchange: def}
		if hname != "" || hvalue != "" {
			m.Headers = map[string]string{hname: hvalue}
		}
		err := m.validate(0, 8)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		switch {
		case (m.Destination == "") != m.DefaultExchange:
			t.Fatalf("accepted destination %q with DefaultExchange %v", m.Destination, m.DefaultExchange)
		case m.DefaultExchange && m.RoutingKey == "":
			t.Fatal("accepted the default exchange without a routing key")
		case len(m.Body) > 8:
			t.Fatalf("accepted a body of %d bytes over the limit of 8", len(m.Body))
		}
		for _, s := range []string{m.Destination, m.RoutingKey, m.Key, hvalue} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				t.Fatalf("accepted %q", s)
			}
		}
		for k := range m.Headers {
			if k == "" || strings.ContainsAny(k, " \t\n") {
				t.Fatalf("accepted header name %q", k)
			}
		}
	})
}
