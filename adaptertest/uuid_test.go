package adaptertest

import (
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The UUIDv7 the partitioned checks publish carries the time a
// partitioned inbox places it by, to the millisecond.
func TestUUIDv7CarriesItsTime(t *testing.T) {
	at := time.Date(2026, 9, 1, 23, 59, 58, 123_000_000, time.UTC)
	a, b := UUIDv7(at), UUIDv7(at)
	if a == b {
		t.Fatalf("two UUIDv7 of the same millisecond are equal: %s", a)
	}
	for _, id := range []string{a, b} {
		got, ok := idem.TimeFromUUIDv7(id)
		if !ok || !got.Equal(at) {
			t.Errorf("TimeFromUUIDv7(%s) = %v, %v; want %v", id, got, ok, at)
		}
	}
	if _, ok := idem.TimeFromUUIDv7("order-17"); ok {
		t.Error("a plain ID reads as a UUIDv7")
	}
}
