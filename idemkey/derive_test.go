package idemkey_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkey"
)

func TestDeriveReadable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		action string
		parts  []string
		want   string
	}{
		{"renew", []string{"sub-8421", "2026-03"}, "renew:sub-8421:2026-03"},
		{"refund", nil, "refund"},
		{"refund", []string{""}, "refund:"},
		{"ship", []string{"a:b", "c"}, "ship:a%3Ab:c"},
		{"ship", []string{"a", "b:c"}, "ship:a:b%3Ac"},
		{"ship", []string{"100%"}, "ship:100%25"},
		{"greet", []string{"Nguyễn Văn A"}, "greet:Nguy%E1%BB%85n%20V%C4%83n%20A"},
	}
	for _, c := range cases {
		if got := idemkey.Derive(c.action, c.parts...); got != c.want {
			t.Errorf("Derive(%q, %q) = %q, want %q", c.action, c.parts, got, c.want)
		}
	}
}

func TestDeriveBounded(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 300)
	a := idemkey.Derive("renew", long)
	b := idemkey.Derive("renew", long+"y")
	if len(a) > idemkey.MaxLen || !strings.HasPrefix(a, "renew~") || len(a) != len("renew~")+64 {
		t.Fatalf("long key = %q (%d bytes), want renew~<64 hex>", a, len(a))
	}
	if a == b {
		t.Fatal("two long keys differing in one byte share a digest")
	}
	if err := idemkey.Validate(a); err != nil {
		t.Fatal(err)
	}
	// The longest readable key stays readable; one byte more is hashed.
	fit := strings.Repeat("y", idemkey.MaxLen-len("renew:"))
	if got := idemkey.Derive("renew", fit); got != "renew:"+fit {
		t.Fatalf("key of exactly MaxLen was changed to %q", got)
	}
	if got := idemkey.Derive("renew", fit+"y"); !strings.HasPrefix(got, "renew~") {
		t.Fatalf("key of MaxLen+1 bytes = %q, want hashed", got)
	}
}

func TestDeriveRejectsBadActions(t *testing.T) {
	t.Parallel()
	for _, action := range []string{"", "-renew", "re:new", "re new", "@msg", "renew~", strings.Repeat("a", idemkey.MaxActionLen+1)} {
		if _, err := idemkey.Check(action, "x"); !errors.Is(err, idemkey.ErrInvalidKey) {
			t.Errorf("Check(%q) error = %v, want ErrInvalidKey", action, err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Derive(%q) did not panic", action)
				}
			}()
			idemkey.Derive(action, "x")
		}()
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"8e03978e-40d5-43e8-bc93-6894a57f9324", "renew:sub-8421:2026-03", "x"} {
		if err := idemkey.Validate(ok); err != nil {
			t.Errorf("Validate(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "has space", "tab\t", "ü", strings.Repeat("k", idemkey.MaxLen+1)} {
		if err := idemkey.Validate(bad); !errors.Is(err, idemkey.ErrInvalidKey) {
			t.Errorf("Validate(%q) = %v, want ErrInvalidKey", bad, err)
		}
	}
}

func TestForMessageStableAcrossRedeliveries(t *testing.T) {
	t.Parallel()
	first := idem.Message{ID: "evt-42", Source: "billing/0", Body: []byte(`{}`), Attempt: 1}
	again := idem.Message{ID: "evt-42", Source: "billing.retry", Body: []byte(`{ }`), Attempt: 3, Redelivered: true}
	a := idemkey.ForMessage("invoices", first, "charge")
	if b := idemkey.ForMessage("invoices", again, "charge"); a != b {
		t.Fatalf("redelivery changed the key: %q then %q", a, b)
	}
	if a != "@msg:invoices:evt-42:charge" {
		t.Fatalf("ForMessage = %q", a)
	}
	distinct := map[string]bool{a: true}
	for _, k := range []string{
		idemkey.ForMessage("invoices", first, "notify"),
		idemkey.ForMessage("ledger", first, "charge"),
		idemkey.ForMessage("invoices", idem.Message{ID: "evt-43"}, "charge"),
		idemkey.ForMessage("invoices:evt-42", idem.Message{ID: "charge"}, "x"),
	} {
		if distinct[k] {
			t.Fatalf("key %q repeated for a different call", k)
		}
		distinct[k] = true
	}
	if err := idemkey.Validate(a); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("ForMessage without a message ID did not panic")
		}
	}()
	idemkey.ForMessage("invoices", idem.Message{}, "charge")
}

// FuzzDerive checks that Derive is injective: two different lists of parts
// never share a key, and every key is valid.
func FuzzDerive(f *testing.F) {
	f.Add("a-b", "c", "a", "b-c")
	f.Add("a:b", "c", "a", "b:c")
	f.Add("a%3Ab", "", "a:b", "")
	f.Add("", "x", "x", "")
	f.Add(strings.Repeat("z", 300), "1", strings.Repeat("z", 300), "2")
	f.Add("sha256", strings.Repeat("0", 64), "~", "")
	f.Fuzz(func(t *testing.T, a1, a2, b1, b2 string) {
		for _, p := range [][2][]string{
			{{a1, a2}, {b1, b2}},
			{{a1 + a2}, {b1, b2}},
			{{a1}, {b1, b2}},
		} {
			ka, kb := idemkey.Derive("act", p[0]...), idemkey.Derive("act", p[1]...)
			for _, k := range []string{ka, kb} {
				if err := idemkey.Validate(k); err != nil {
					t.Fatalf("Derive gave an invalid key: %v", err)
				}
			}
			same := len(p[0]) == len(p[1])
			for i := 0; same && i < len(p[0]); i++ {
				same = p[0][i] == p[1][i]
			}
			if (ka == kb) != same {
				t.Fatalf("parts %q and %q: keys %q and %q", p[0], p[1], ka, kb)
			}
		}
	})
}
