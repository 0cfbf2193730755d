// Package bloom is a Bloom filter meant to be stored: a compact summary of a
// set of keys that answers "certainly not in the set" or "probably in it",
// with a false-positive rate chosen when it is made. It is made for the
// summaries of pruned markers: one filter per consumer and day of the keys
// whose markers prune deleted, stored in the database (MarshalBinary) and
// checked in memory (Has) on every fresh claim, so that a late duplicate is
// seen after its marker is gone.
//
// # Sizing
//
// [New] sizes a filter for n keys and a false-positive rate p with the
// standard formulas: m = ceil(-n ln p / (ln 2)²) bits, rounded up to whole
// 64-bit words, and k = round(-log₂ p) hash functions (at least 1). That is
// about 1.44·log₂(1/p) bits per key: 14.4 bits (1.80 MB per million keys) at
// p = 1e-3, 28.8 bits (3.59 MB per million) at p = 1e-6.
//
// # Hashing
//
// A stored filter is read by other processes and later releases, so the
// hash must be a fixed function of the key, the same everywhere and forever.
// hash/maphash cannot be one: its seeds come only from MakeSeed, random per
// process, so a filter written by one process would be garbage to the next.
// The hash is FNV-1a 64 (the published algorithm of hash/fnv, written out
// here over the key's bytes so that hashing allocates nothing), followed by
// two fixed 64-bit finalizers (MurmurHash3's fmix64, the second after xoring
// a constant) giving h1 and h2: FNV-1a alone mixes the last bytes of a key
// into the high bits poorly, and the indexes are taken from the high bits.
// The k indexes come from one hash by enhanced double hashing (Dillinger and
// Manolios): x = h1, y = h2; index i is the high 64 bits of x·m, then
// x += y, y += i. Anyone can recompute the indexes from this paragraph; the
// hash-scheme byte of the encoding names this scheme, and a future scheme
// gets another number.
//
// # Encoding
//
// MarshalBinary writes, little-endian: the magic "IDBF", the version (1),
// the hash scheme (1), k (uint16), m in bits (uint64), the count of keys
// added (uint64), the capacity n and the rate p the filter was made for
// (uint64, float64), the m/64 words of the bit array (uint64 each) and a
// CRC-32C of everything before it. UnmarshalBinary checks all of it, the
// sizes before it allocates, and returns an error wrapping [ErrCorrupt] for
// a blob it cannot trust; it never panics.
//
// A Filter is not safe for concurrent Add, Merge or UnmarshalBinary; Has,
// Len, SizeBytes and MarshalBinary may run concurrently with each other.
package bloom

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
)

// Filter is a Bloom filter. The zero value is not usable; make one with
// [New] or [Filter.UnmarshalBinary].
type Filter struct {
	words []uint64 // the bit array, m = 64·len(words) bits
	m     uint64   // bits
	k     uint32   // hash functions
	count uint64   // Adds that set a bit
	n     uint64   // capacity it was made for
	p     float64  // false-positive rate it was made for
}

// MaxBits bounds m, to 2^40 bits (128 GiB).
const MaxBits = 1 << 40

// MaxK bounds the hash functions: the smallest rate New accepts, 1e-15,
// takes 50.
const MaxK = 50

// ErrCorrupt is wrapped by the errors of UnmarshalBinary.
var ErrCorrupt = errors.New("bloom: corrupt filter")

// ErrIncompatible is returned by Merge for filters of different parameters.
var ErrIncompatible = errors.New("bloom: filters of different parameters")

// New returns an empty filter sized for n keys at false-positive rate
// fpRate. n must be at least 1; fpRate must lie in [1e-15, 0.5]; the bit
// array must fit in [MaxBits].
func New(n int, fpRate float64) (*Filter, error) {
	if n < 1 {
		return nil, fmt.Errorf("bloom: capacity %d, want at least 1", n)
	}
	if !(fpRate >= 1e-15 && fpRate <= 0.5) { // NaN fails too
		return nil, fmt.Errorf("bloom: false-positive rate %v, want one in [1e-15, 0.5]", fpRate)
	}
	m, k, ok := params(uint64(n), fpRate)
	if !ok {
		return nil, fmt.Errorf("bloom: %d keys at rate %v need too many bits", n, fpRate)
	}
	return &Filter{words: make([]uint64, m/64), m: m, k: k, n: uint64(n), p: fpRate}, nil
}

// params are the standard m (rounded up to whole words) and k; ok is false
// when the bit array could not be allocated.
func params(n uint64, p float64) (m uint64, k uint32, ok bool) {
	bitsNeeded := math.Ceil(-float64(n) * math.Log(p) / (math.Ln2 * math.Ln2))
	if bitsNeeded > MaxBits {
		return 0, 0, false
	}
	m = (uint64(bitsNeeded) + 63) &^ 63
	k = uint32(max(1, min(MaxK, math.Round(-math.Log2(p)))))
	return m, k, true
}

// Add puts key in the filter. It panics on the zero Filter.
func (f *Filter) Add(key string) {
	if f.m == 0 {
		panic("bloom: Add on a Filter not made by New or UnmarshalBinary")
	}
	x, y := hash(key)
	set := false
	for i := range uint64(f.k) {
		idx, _ := bits.Mul64(x, f.m)
		w, b := idx>>6, uint64(1)<<(idx&63)
		if f.words[w]&b == 0 {
			f.words[w] |= b
			set = true
		}
		x += y
		y += i
	}
	if set {
		f.count++
	}
}

// Has reports whether key may be in the filter: false means it was never
// added; true is wrong at about the rate the filter was made for, while it
// holds no more keys than its capacity. The zero Filter has no key.
func (f *Filter) Has(key string) bool {
	if f.m == 0 {
		return false
	}
	x, y := hash(key)
	for i := range uint64(f.k) {
		idx, _ := bits.Mul64(x, f.m)
		if f.words[idx>>6]&(uint64(1)<<(idx&63)) == 0 {
			return false
		}
		x += y
		y += i
	}
	return true
}

// Len is the number of keys added, each counted once as far as the filter
// can tell: an Add that sets no new bit (the key was there already, or is a
// false positive) is not counted. After a Merge it is the sum of both
// counts, an overcount when the two sets overlap.
func (f *Filter) Len() int { return int(min(f.count, math.MaxInt)) }

// SizeBytes is the size of the bit array, what the filter holds in memory;
// MarshalBinary adds 44 bytes to it.
func (f *Filter) SizeBytes() int { return len(f.words) * 8 }

// Bits is m, the size of the bit array in bits.
func (f *Filter) Bits() uint64 { return f.m }

// K is the number of hash functions.
func (f *Filter) K() int { return int(f.k) }

// Cap is the capacity, in keys, the filter was made for.
func (f *Filter) Cap() int { return int(min(f.n, math.MaxInt)) }

// Rate is the false-positive rate the filter was made for.
func (f *Filter) Rate() float64 { return f.p }

// EstimatedRate is the false-positive rate expected of the filter as it is,
// (1 - e^(-k·Len/m))^k: below Rate until it holds Cap keys, above after.
func (f *Filter) EstimatedRate() float64 {
	k := float64(f.k)
	return math.Pow(-math.Expm1(-k*float64(f.count)/float64(f.m)), k)
}

// Merge adds every key of other to f: afterwards f has what either had. The
// two must have the same m and k (as filters made by New with the same
// arguments do); otherwise Merge returns [ErrIncompatible] and changes
// nothing.
func (f *Filter) Merge(other *Filter) error {
	if other == nil || f.m != other.m || f.k != other.k {
		return ErrIncompatible
	}
	for i, w := range other.words {
		f.words[i] |= w
	}
	f.count += other.count
	return nil
}

// The encoding.
const (
	magic      = "IDBF"
	version    = 1
	hashScheme = 1 // FNV-1a 64, fmix64 finalizers, enhanced double hashing
	headerLen  = 40
	trailerLen = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MarshalBinary encodes the filter as the package doc describes.
func (f *Filter) MarshalBinary() ([]byte, error) {
	b := make([]byte, headerLen, headerLen+len(f.words)*8+trailerLen)
	copy(b, magic)
	b[4], b[5] = version, hashScheme
	binary.LittleEndian.PutUint16(b[6:], uint16(f.k))
	binary.LittleEndian.PutUint64(b[8:], f.m)
	binary.LittleEndian.PutUint64(b[16:], f.count)
	binary.LittleEndian.PutUint64(b[24:], f.n)
	binary.LittleEndian.PutUint64(b[32:], math.Float64bits(f.p))
	for _, w := range f.words {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// UnmarshalBinary replaces f with the filter data encodes. A blob that is
// truncated, of another format or version, inconsistent, or that fails its
// checksum is refused with an error wrapping [ErrCorrupt], and f is left
// unchanged.
func (f *Filter) UnmarshalBinary(data []byte) error {
	if len(data) < headerLen+trailerLen {
		return fmt.Errorf("%w: %d bytes, shorter than the %d of an empty one", ErrCorrupt, len(data), headerLen+trailerLen)
	}
	if string(data[:4]) != magic {
		return fmt.Errorf("%w: magic %q, want %q", ErrCorrupt, data[:4], magic)
	}
	if data[4] != version {
		return fmt.Errorf("%w: version %d, this code reads %d", ErrCorrupt, data[4], version)
	}
	if data[5] != hashScheme {
		return fmt.Errorf("%w: hash scheme %d, this code knows %d", ErrCorrupt, data[5], hashScheme)
	}
	k := uint32(binary.LittleEndian.Uint16(data[6:]))
	m := binary.LittleEndian.Uint64(data[8:])
	count := binary.LittleEndian.Uint64(data[16:])
	n := binary.LittleEndian.Uint64(data[24:])
	p := math.Float64frombits(binary.LittleEndian.Uint64(data[32:]))
	body := uint64(len(data) - headerLen - trailerLen)
	switch {
	case k < 1 || k > MaxK:
		return fmt.Errorf("%w: k = %d, want 1 to %d", ErrCorrupt, k, MaxK)
	case m == 0 || m%64 != 0 || m > MaxBits:
		return fmt.Errorf("%w: m = %d bits, want a positive multiple of 64 up to %d", ErrCorrupt, m, uint64(MaxBits))
	case m/8 != body:
		return fmt.Errorf("%w: m = %d bits, but %d bytes of bits follow", ErrCorrupt, m, body)
	case n < 1 || !(p >= 1e-15 && p <= 0.5):
		return fmt.Errorf("%w: made for %d keys at rate %v", ErrCorrupt, n, p)
	}
	sum := binary.LittleEndian.Uint32(data[len(data)-trailerLen:])
	if got := crc32.Checksum(data[:len(data)-trailerLen], castagnoli); got != sum {
		return fmt.Errorf("%w: checksum %08x, want %08x", ErrCorrupt, got, sum)
	}
	words := make([]uint64, m/64)
	for i := range words {
		words[i] = binary.LittleEndian.Uint64(data[headerLen+8*i:])
	}
	*f = Filter{words: words, m: m, k: k, count: count, n: n, p: p}
	return nil
}

// hash is FNV-1a 64 over key, then two fmix64 finalizers.
func hash(key string) (h1, h2 uint64) {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime64
	}
	return fmix64(h), fmix64(h ^ 0x9e3779b97f4a7c15)
}

// fmix64 is the finalizer of MurmurHash3, a bijection on 64 bits in which
// every input bit affects every output bit.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
