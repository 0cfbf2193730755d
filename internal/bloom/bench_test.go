package bloom

import (
	"fmt"
	"testing"
)

// benchKeys are the one million keys of the benchmarks, shaped like the
// business keys of a consumer.
func benchKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%sinvoice:c%07d:2026-03", prefix, i)
	}
	return keys
}

// BenchmarkHas is the cost of the check of one claim against a filter of a
// million pruned keys: absent keys (every fresh message) and present ones (a
// late duplicate, every hash function probed).
func BenchmarkHas(b *testing.B) {
	const n = 1_000_000
	added, absent := benchKeys("", n), benchKeys("fresh:", n)
	for _, p := range []float64{1e-3, 1e-6} {
		f, err := New(n, p)
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range added {
			f.Add(k)
		}
		for _, c := range []struct {
			name string
			keys []string
		}{{"absent", absent}, {"present", added}} {
			b.Run(fmt.Sprintf("p=%g/%s", p, c.name), func(b *testing.B) {
				i, hits := 0, 0
				for b.Loop() {
					if f.Has(c.keys[i]) {
						hits++
					}
					if i++; i == len(c.keys) {
						i = 0
					}
				}
				b.ReportMetric(float64(f.SizeBytes())/(1<<20), "MiB/1Mkeys")
				_ = hits
			})
		}
	}
}

func BenchmarkAdd(b *testing.B) {
	const n = 1_000_000
	keys := benchKeys("", n)
	f, err := New(n, 1e-6)
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		f.Add(keys[i])
		if i++; i == len(keys) {
			i = 0
		}
	}
}

// BenchmarkMemoryPerMillionKeys reports what a summary of a million pruned
// keys takes, in memory (the bit array) and stored (MarshalBinary), and how
// long encoding and decoding it take.
func BenchmarkMemoryPerMillionKeys(b *testing.B) {
	for _, p := range []float64{1e-3, 1e-6} {
		f, err := New(1_000_000, p)
		if err != nil {
			b.Fatal(err)
		}
		blob, _ := f.MarshalBinary()
		b.Run(fmt.Sprintf("p=%g/marshal", p), func(b *testing.B) {
			for b.Loop() {
				_, _ = f.MarshalBinary()
			}
			b.ReportMetric(float64(f.SizeBytes()), "bytes-in-memory")
			b.ReportMetric(float64(len(blob)), "bytes-stored")
			b.ReportMetric(float64(f.Bits())/1e6, "bits/key")
		})
		b.Run(fmt.Sprintf("p=%g/unmarshal", p), func(b *testing.B) {
			var g Filter
			for b.Loop() {
				if err := g.UnmarshalBinary(blob); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHash is the hashing part of Has and Add, for a key of the shape
// of the others (27 bytes).
func BenchmarkHash(b *testing.B) {
	keys := benchKeys("", 1024)
	var sink uint64
	i := 0
	for b.Loop() {
		h1, h2 := hash(keys[i&1023])
		sink += h1 ^ h2
		i++
	}
	_ = sink
}
