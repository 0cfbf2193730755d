package idem

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzValidKey: a key is accepted exactly when it is non-empty, at most
// MaxKeyLen bytes, valid UTF-8 and free of NUL bytes — the properties every
// store relies on (text columns, index size).
func FuzzValidKey(f *testing.F) {
	for _, seed := range []string{"invoice:cus-8421:2026-09", "", "a\x00b", "inv\xff", strings.Repeat("k", MaxKeyLen), strings.Repeat("k", MaxKeyLen+1), "ключ", "🧾"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		want := key != "" && len(key) <= MaxKeyLen && utf8.ValidString(key) && !strings.Contains(key, "\x00")
		if got := validKey(key) == nil; got != want {
			t.Fatalf("validKey(%q) accepted=%v, want %v", key, got, want)
		}
	})
}

// FuzzTimeFromUUIDv7: never panics, and accepts only version-7, RFC 9562
// variant UUIDs.
func FuzzTimeFromUUIDv7(f *testing.F) {
	for _, seed := range []string{"019cf1a2-b3c4-7def-8123-456789abcdef", "019cf1a2b3c47def8123456789abcdef", "", "not-a-uuid",
		"019cf1a2-b3c4-4def-8123-456789abcdef", "019cf1a2b-3c4-7def-8123-456789abcde"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		tm, ok := TimeFromUUIDv7(id)
		if !ok {
			return
		}
		hex := id
		if len(id) == 36 {
			if strings.Count(id, "-") != 4 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
				t.Fatalf("%q accepted with misplaced hyphens", id)
			}
			hex = strings.ReplaceAll(id, "-", "")
		}
		if len(hex) != 32 || hex[12] != '7' || !strings.ContainsRune("89abAB", rune(hex[16])) || tm.IsZero() {
			t.Fatalf("%q accepted as UUIDv7 (time %v)", id, tm)
		}
	})
}
