package bloom

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"strconv"
	"testing"
)

func key(prefix string, i int) string { return prefix + strconv.Itoa(i) }

func mustNew(t testing.TB, n int, p float64) *Filter {
	t.Helper()
	f, err := New(n, p)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestNewSizesByTheStandardFormulas(t *testing.T) {
	for _, c := range []struct {
		n       int
		p       float64
		m       uint64
		k       int
		perMKey float64 // bytes per million keys, about
	}{
		// m = ceil(-n ln p / ln²2) rounded up to 64; k = round(-log2 p).
		{1_000_000, 1e-3, 14_377_600, 10, 1.797e6},
		{1_000_000, 1e-6, 28_755_200, 20, 3.594e6},
		{1, 0.5, 64, 1, 0},
		{1000, 0.01, 9600, 7, 0},
	} {
		f := mustNew(t, c.n, c.p)
		if f.Bits() != c.m || f.K() != c.k || f.SizeBytes() != int(c.m/8) || f.Cap() != c.n || f.Rate() != c.p {
			t.Errorf("New(%d, %v): m=%d k=%d size=%d; want m=%d k=%d", c.n, c.p, f.Bits(), f.K(), f.SizeBytes(), c.m, c.k)
		}
		if want := math.Ceil(-float64(c.n) * math.Log(c.p) / (math.Ln2 * math.Ln2)); float64(f.Bits()) < want || float64(f.Bits()) >= want+64 {
			t.Errorf("New(%d, %v): m=%d, want %v rounded up to 64", c.n, c.p, f.Bits(), want)
		}
		if c.perMKey > 0 && math.Abs(float64(f.SizeBytes())-c.perMKey)/c.perMKey > 0.001 {
			t.Errorf("New(%d, %v): %d bytes, want about %v", c.n, c.p, f.SizeBytes(), c.perMKey)
		}
	}
	for _, bad := range []struct {
		n int
		p float64
	}{{0, 0.01}, {-1, 0.01}, {10, 0}, {10, 1}, {10, 0.6}, {10, 1e-16}, {10, math.NaN()}, {10, math.Inf(1)}, {math.MaxInt, 1e-15}} {
		if _, err := New(bad.n, bad.p); err == nil {
			t.Errorf("New(%d, %v) accepted", bad.n, bad.p)
		}
	}
}

// The rate measured on keys never added is close to the rate the filter was
// made for, and no added key is ever missed.
func TestFalsePositiveRateAndNoFalseNegatives(t *testing.T) {
	for _, c := range []struct {
		n, queries int
		p          float64
	}{
		{200_000, 1_000_000, 1e-2},
		{200_000, 1_000_000, 1e-3},
		{100_000, 2_000_000, 1e-4},
	} {
		f := mustNew(t, c.n, c.p)
		for i := range c.n {
			f.Add(key("invoice:c", i))
		}
		for i := range c.n {
			if !f.Has(key("invoice:c", i)) {
				t.Fatalf("p=%v: key %d added but not found", c.p, i)
			}
		}
		if f.Len() < c.n*99/100 || f.Len() > c.n {
			t.Errorf("p=%v: Len %d after %d distinct keys", c.p, f.Len(), c.n)
		}
		fp := 0
		for i := range c.queries {
			if f.Has(key("absent:", i)) {
				fp++
			}
		}
		measured := float64(fp) / float64(c.queries)
		// The filter is sized up, so its own rate is at or below p; allow
		// four standard deviations of the count, and 15% of p for the
		// rounding of k.
		expected := f.EstimatedRate()
		sd := math.Sqrt(float64(c.queries)*expected) / float64(c.queries)
		t.Logf("p=%v n=%d: %d of %d absent keys found, rate %.3g (expected %.3g)", c.p, c.n, fp, c.queries, measured, expected)
		if expected > c.p*1.05 { // k rounded to an integer costs a few percent at most
			t.Errorf("p=%v: expected rate %.3g above the target", c.p, expected)
		}
		if math.Abs(measured-expected) > 4*sd+0.15*c.p {
			t.Errorf("p=%v: measured rate %.3g, want %.3g within tolerance", c.p, measured, expected)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	f := mustNew(t, 5000, 1e-6)
	for i := range 5000 {
		f.Add(key("k", i))
	}
	b, err := f.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != f.SizeBytes()+44 {
		t.Fatalf("encoded %d bytes for %d of bits", len(b), f.SizeBytes())
	}
	var g Filter
	if err := g.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if g.Bits() != f.Bits() || g.K() != f.K() || g.Len() != f.Len() || g.Cap() != 5000 || g.Rate() != 1e-6 {
		t.Fatalf("decoded m=%d k=%d len=%d cap=%d rate=%v", g.Bits(), g.K(), g.Len(), g.Cap(), g.Rate())
	}
	for i := range 5000 {
		if !g.Has(key("k", i)) {
			t.Fatalf("decoded filter misses key %d", i)
		}
	}
	again, _ := g.MarshalBinary()
	if !bytes.Equal(again, b) {
		t.Fatal("re-encoding a decoded filter gives other bytes")
	}
}

// The encoding is pinned: filters are stored, so the hash and the layout of
// a released version must never change. A change that breaks this test needs
// a new version or hash scheme, not a new expected value.
func TestEncodingIsStable(t *testing.T) {
	if h1, h2 := hash("invoice:c1:2026-03"); h1 != pinnedH1 || h2 != pinnedH2 {
		t.Fatalf("hash(invoice:c1:2026-03) = %#x, %#x; want %#x, %#x", h1, h2, uint64(pinnedH1), uint64(pinnedH2))
	}
	f := mustNew(t, 10, 0.01)
	for _, k := range []string{"a", "invoice:c1:2026-03", ""} {
		f.Add(k)
	}
	b, _ := f.MarshalBinary()
	if got := hexOf(b); got != pinnedBlob {
		t.Fatalf("encoding\n%s, want\n%s", got, pinnedBlob)
	}
}

const (
	pinnedH1   = 0xcb63472da8e71c34
	pinnedH2   = 0xf66cdcf41ff8e5ef
	pinnedBlob = "4944424601010700800000000000000003000000000000000a000000000000007b14ae47e17a843f" + // header: m=128, k=7, 3 keys, n=10, p=0.01
		"2080000200290008" + "12a184302900c000" + // the two words
		"cb6eaae6" // CRC-32C
)

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

func TestFNV1aIsTheStandardOne(t *testing.T) {
	// FNV-1a 64 test vectors, before the finalizers.
	for _, c := range []struct {
		in   string
		want uint64
	}{{"", 0xcbf29ce484222325}, {"a", 0xaf63dc4c8601ec8c}, {"foobar", 0x85944171f73967e8}} {
		h1, _ := hash(c.in)
		if h1 != fmix64(c.want) {
			t.Errorf("FNV-1a 64 of %q is not %#x", c.in, c.want)
		}
	}
}

func TestMerge(t *testing.T) {
	a, b := mustNew(t, 1000, 1e-4), mustNew(t, 1000, 1e-4)
	for i := range 500 {
		a.Add(key("a", i))
		b.Add(key("b", i))
	}
	if err := a.Merge(b); err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		if !a.Has(key("a", i)) || !a.Has(key("b", i)) {
			t.Fatalf("merged filter misses key %d", i)
		}
	}
	if a.Len() != 1000 {
		t.Errorf("merged Len %d, want 1000", a.Len())
	}
	for _, other := range []*Filter{mustNew(t, 1000, 1e-3), mustNew(t, 2000, 1e-4), nil} {
		before, _ := a.MarshalBinary()
		if err := a.Merge(other); !errors.Is(err, ErrIncompatible) {
			t.Errorf("merge with other parameters: %v, want ErrIncompatible", err)
		}
		if after, _ := a.MarshalBinary(); !bytes.Equal(before, after) {
			t.Error("a refused merge changed the filter")
		}
	}
}

func TestZeroFilter(t *testing.T) {
	var f Filter
	if f.Has("x") || f.Len() != 0 {
		t.Fatal("the zero filter has a key")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Add on the zero filter did not panic")
		}
	}()
	f.Add("x")
}

// reseal recomputes the checksum of a blob edited in place.
func reseal(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

func TestUnmarshalRefusesCorruptInput(t *testing.T) {
	f := mustNew(t, 100, 0.01)
	f.Add("x")
	good, _ := f.MarshalBinary()
	edit := func(fn func(b []byte) []byte) []byte { return fn(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":         {},
		"header only":   good[:40],
		"truncated":     good[:len(good)-1],
		"one byte more": reseal(append(bytes.Clone(good), 0)),
		"magic":         edit(func(b []byte) []byte { b[0] = 'X'; return reseal(b) }),
		"version":       edit(func(b []byte) []byte { b[4] = 2; return reseal(b) }),
		"hash scheme":   edit(func(b []byte) []byte { b[5] = 9; return reseal(b) }),
		"k zero":        edit(func(b []byte) []byte { b[6], b[7] = 0, 0; return reseal(b) }),
		"k too large":   edit(func(b []byte) []byte { b[6] = MaxK + 1; return reseal(b) }),
		"m not words":   edit(func(b []byte) []byte { b[8]++; return reseal(b) }),
		"m beyond data": edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 1<<39); return reseal(b) }),
		"m huge":        edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], math.MaxUint64&^63); return reseal(b) }),
		"capacity zero": edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 0); return reseal(b) }),
		"rate NaN": edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[32:], math.Float64bits(math.NaN()))
			return reseal(b)
		}),
		"a bit flipped":   edit(func(b []byte) []byte { b[50] ^= 4; return b }),
		"checksum":        edit(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }),
		"count, unsealed": edit(func(b []byte) []byte { b[16]++; return b }),
	}
	for name, b := range cases {
		g := mustNew(t, 10, 0.5)
		g.Add("kept")
		if err := g.UnmarshalBinary(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
		if !g.Has("kept") || g.Cap() != 10 {
			t.Errorf("%s: a refused blob changed the filter", name)
		}
	}
}

// FuzzUnmarshalBinary decodes arbitrary blobs, as they are and with their
// checksum recomputed (so that the checks behind it are reached too): each
// is refused with ErrCorrupt or decodes to a working filter, never a panic.
func FuzzUnmarshalBinary(f *testing.F) {
	small := mustNew(f, 10, 0.1)
	small.Add("a")
	good, _ := small.MarshalBinary()
	f.Add(good)
	f.Add(good[:44])
	f.Add([]byte("IDBF"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		try := func(data []byte) {
			var g Filter
			if err := g.UnmarshalBinary(data); err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("error %v does not wrap ErrCorrupt", err)
				}
				return
			}
			if again, _ := g.MarshalBinary(); !bytes.Equal(again, data) {
				t.Fatal("a decoded filter encodes to other bytes")
			}
			g.Has("a")
			g.Add("b")
			if !g.Has("b") {
				t.Fatal("added key not found")
			}
		}
		try(data)
		if len(data) >= 4 {
			try(reseal(bytes.Clone(data)))
		}
	})
}
